// Checks every slide of a reveal.js deck laid out for printing (?print-pdf: every slide on
// its own 1280 x 720 page, fragments shown), then writes the findings as JSON into
// the result of window.deckCheck() for tests/course/test_slides.py.
(function () {
  const MIN_TEXT_PX = 24, MIN_CODE_PX = 18, SLACK = 1;
  const RAW_MATH = /\$\$|\\frac|\\cdot|\\text\{|\\times/;
  function visible(el) {
    const style = getComputedStyle(el);
    return style.display !== "none" && style.visibility !== "hidden" && el.getClientRects().length;
  }
  function isCode(el) { return !!el.closest("pre, code, .highlight, .jp-CodeMirrorEditor"); }
  function check() {
    const slides = [...document.querySelectorAll(".reveal .pdf-page > section")];
    const report = slides.map((section, index) => {
      const problems = [], overflowing = [];
      const box = section.getBoundingClientRect();
      const page = section.closest(".pdf-page").getBoundingClientRect();
      const right = page.left + 1280 + SLACK, bottom = page.top + 720 + SLACK;
      for (const el of section.querySelectorAll("*")) {
        if (el.closest("aside.notes, .katex") && !el.matches(".katex")) continue;
        if (!visible(el)) continue;
        const r = el.getBoundingClientRect();
        const name = el.tagName.toLowerCase() + (el.className && typeof el.className === "string"
          ? "." + el.className.split(" ")[0] : "");
        if (r.width && (r.right > right || r.bottom > bottom || r.left < page.left - SLACK))
          overflowing.push([el, `${name} overflows the slide (${Math.round(r.right - page.left)} x ` +
                        `${Math.round(r.bottom - page.top)} px of 1280 x 720): ` +
                        JSON.stringify(el.textContent.trim().slice(0, 60))]);
        if (el.scrollWidth > el.clientWidth + SLACK && getComputedStyle(el).overflowX !== "visible")
          problems.push(`${name} clips its content (${el.scrollWidth} px wide in ` +
                        `${el.clientWidth} px): ` + JSON.stringify(el.textContent.trim().slice(0, 60)));
        const ownText = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
        if (ownText && !el.closest(".katex")) {
          const size = parseFloat(getComputedStyle(el).fontSize);
          const least = isCode(el) ? MIN_CODE_PX : MIN_TEXT_PX;
          if (size < least - 0.01)
            problems.push(`${isCode(el) ? "code" : "text"} at ${size} px (at least ${least}): ` +
                          JSON.stringify(el.textContent.trim().slice(0, 60)));
        }
      }
      // Name the innermost elements that overflow, not every box around them.
      for (const [el, message] of overflowing)
        if (!overflowing.some(([other]) => other !== el && el.contains(other))) problems.push(message);
      const copy = section.cloneNode(true);
      copy.querySelectorAll(".katex, aside.notes").forEach(n => n.remove());
      const raw = copy.textContent.match(RAW_MATH);
      if (raw) problems.push(`raw LaTeX ${JSON.stringify(raw[0])} in the rendered text`);
      const figures = [...section.querySelectorAll("img")].filter(visible);
      if (figures.length > 1) problems.push(`${figures.length} figures on one slide`);
      const top = section.closest(".pdf-page").getBoundingClientRect().top + window.scrollY;
      const title = (section.querySelector("h1, h2, h3") || {}).textContent || "";
      return {slide: index + 1, top, title: title.trim().replace(/¶$/, ""), problems,
              fragments: section.querySelectorAll(".fragment").length,
              notes: !!(section.querySelector("aside.notes") || {}).textContent};
    });
    return report;
  }
  // reveal.js lays the slides out for printing after it is ready, one page per slide: check
  // once the number of pages has held still for a few polls.
  window.deckCheck = () => new Promise((resolve, reject) => {
    let last = -1, still = 0;
    const poll = setInterval(() => {
      const pages = document.querySelectorAll(".pdf-page").length;
      still = pages && pages === last ? still + 1 : 0;
      last = pages;
      if (still >= 3) { clearInterval(poll); document.fonts.ready.then(check).then(resolve, reject); }
    }, 100);
  });
})();
