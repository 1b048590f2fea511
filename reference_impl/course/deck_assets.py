"""The CSS and JavaScript inlined into every deck: a tiny slide engine of our own.

Slides are laid out on a fixed 1280 x 720 canvas, which is scaled to fit the window. On a
slide, figures take the height the text leaves them (shrunk to fit, never enlarged beyond
their pixel size); a slide whose text alone is too tall or wide is shrunk as a whole.

Keys: Right, Down, Space, PageDown, Enter next; Left, Up, Shift+Space, PageUp, Backspace
previous; Home, End first and last; N speaker notes; F full screen. The URL hash is the slide
number (``deck.html#3``). Once the script has run, ``<body>`` carries ``data-slide-count`` and
``data-current`` (1-based). Without JavaScript, and when printed, the slides are shown one
after another.
"""

DECK_CSS = """
:root { --accent: #c2410c; --ink: #1f2328; --muted: #57606a; --rule: #d0d7de;
        --code-bg: #f6f8fa; --scale: 1; }
* { box-sizing: border-box; }
html, body { margin: 0; background: #2b2d31; }
body { color: var(--ink); font: 26px/1.4 system-ui, "Segoe UI", Roboto, "Helvetica Neue",
       "DejaVu Sans", Arial, sans-serif; }

/* The canvas: slides stacked when there is no script; one at a time, scaled, when there is. */
.deck { width: 1280px; margin: 0 auto; }
.slide { position: relative; width: 1280px; height: 720px; margin: 24px 0; overflow: hidden;
         background: #fff; padding: 40px 64px 44px; }
body.js { overflow: hidden; }
body.js .deck { position: fixed; left: 50%; top: 50%; height: 720px; margin: 0;
                transform: translate(-50%, -50%) scale(var(--scale)); }
body.js .slide { position: absolute; inset: 0; margin: 0; visibility: hidden; }
body.js .slide.current { visibility: visible; }

/* Within a slide: a column; a cell with a figure shrinks into the height that is left. */
.slide-body { height: 100%; display: flex; flex-direction: column; transform-origin: top center; }
.slide-body > * { flex: none; }
.slide-body > .has-image { flex: 0 1 auto; min-height: 45%; display: flex; flex-direction: column; }
.has-image > * { flex: none; }
.has-image > .output.image { flex: 0 1 auto; min-height: 0; }
.output.image { margin: 6px 0; }
.output.image img { display: block; width: 100%; height: 100%; object-fit: scale-down; }
.title-slide .slide-body { justify-content: center; }
.title-slide h1 { font-size: 60px; }

h1, h2, h3 { line-height: 1.15; margin: 0 0 18px; }
h1 { font-size: 50px; color: var(--accent); }
h2 { font-size: 42px; color: var(--accent); padding-bottom: 8px;
     border-bottom: 3px solid var(--rule); }
h3 { font-size: 32px; }
p, ul, ol, table { margin: 0 0 14px; }
li { margin: 4px 0; }
a { color: var(--accent); }
.anchor-link { display: none; }
strong { color: #111; }
.markdown img { max-width: 100%; }
blockquote { margin: 0 0 14px; padding: 4px 20px; border-left: 5px solid var(--rule);
             color: var(--muted); }
table { border-collapse: collapse; font-size: 22px; }
th, td { padding: 5px 14px; border-bottom: 1px solid var(--rule); text-align: left;
         vertical-align: top; }
th { border-bottom: 2px solid var(--ink); }

code, pre { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; }
:not(pre) > code { font-size: 0.88em; background: var(--code-bg); padding: 1px 6px;
                   border-radius: 4px; }
pre { margin: 0; font-size: 19px; line-height: 1.35; white-space: pre; }
.highlight { background: var(--code-bg); border-left: 5px solid var(--accent);
             border-radius: 4px; padding: 10px 16px; margin: 8px 0; }
pre.output { padding: 8px 16px; margin: 6px 0; border: 1px solid var(--rule); border-radius: 4px; }
pre.stderr, pre.error { background: #fff5f5; color: #8a1c1c; }

.notes { display: none; }
body.show-notes .slide.current .notes { display: block; position: absolute; left: 0; right: 0;
    bottom: 0; max-height: 45%; overflow: auto; padding: 12px 24px; font-size: 20px;
    background: #fffbe6; border-top: 3px solid #e3b341; }
.slide-number { position: absolute; right: 20px; bottom: 12px; font-size: 16px;
                color: var(--muted); pointer-events: none; }

@media print {
  @page { size: 1280px 720px; margin: 0; }
  html, body { background: #fff; }
  body.js { overflow: visible; }
  body.js .deck { position: static; transform: none; height: auto; }
  body.js .slide { position: relative; visibility: visible; break-after: page; }
  .slide { margin: 0; }
  .slide-number { display: none; }
}
"""

DECK_JS = """
(function () {
  "use strict";
  var WIDTH = 1280, HEIGHT = 720;
  var body = document.body;
  var slides = Array.prototype.slice.call(document.querySelectorAll(".slide"));
  var counter = document.querySelector(".slide-number");
  var current = 0;

  function fitWindow() {  // scale the 1280 x 720 canvas to the window, keeping its shape
    var scale = Math.min(window.innerWidth / WIDTH, window.innerHeight / HEIGHT);
    document.documentElement.style.setProperty("--scale", String(scale));
  }

  function fitContent(slide) {  // shrink content that is taller or wider than its slide
    var content = slide.querySelector(".slide-body"), style = getComputedStyle(slide);
    content.style.transform = "";
    var height = slide.clientHeight - parseFloat(style.paddingTop)
                 - parseFloat(style.paddingBottom);
    var width = slide.clientWidth - parseFloat(style.paddingLeft)
                - parseFloat(style.paddingRight);
    var factor = Math.min(1, height / content.scrollHeight, width / content.scrollWidth);
    if (factor < 1) content.style.transform = "scale(" + factor + ")";
  }

  function show(index) {
    current = Math.max(0, Math.min(slides.length - 1, index));
    slides.forEach(function (slide, i) { slide.classList.toggle("current", i === current); });
    counter.textContent = (current + 1) + " / " + slides.length;
    body.dataset.current = String(current + 1);
    if (location.hash !== "#" + (current + 1)) {
      try { history.replaceState(null, "", "#" + (current + 1)); }
      catch (error) { location.hash = "#" + (current + 1); }
    }
  }

  function showHash() {
    var number = parseInt(location.hash.slice(1), 10);
    show(isNaN(number) ? 0 : number - 1);
  }

  function toggleFullScreen() {
    var page = document.documentElement;
    if (document.fullscreenElement) document.exitFullscreen();
    else if (page.requestFullscreen) page.requestFullscreen();
  }

  var STEPS = { ArrowRight: 1, ArrowDown: 1, PageDown: 1, Enter: 1, " ": 1,
                ArrowLeft: -1, ArrowUp: -1, PageUp: -1, Backspace: -1 };

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.altKey || event.metaKey) return;
    var key = event.key, step = STEPS[key];
    if (key === " " && event.shiftKey) step = -1;
    if (step) show(current + step);
    else if (key === "Home") show(0);
    else if (key === "End") show(slides.length - 1);
    else if (key === "n" || key === "N") body.classList.toggle("show-notes");
    else if (key === "f" || key === "F") toggleFullScreen();
    else return;
    event.preventDefault();
  });
  window.addEventListener("resize", fitWindow);
  window.addEventListener("hashchange", showHash);
  window.addEventListener("load", function () { slides.forEach(fitContent); });

  body.classList.add("js");
  body.dataset.slideCount = String(slides.length);
  fitWindow();
  slides.forEach(fitContent);
  showHash();
})();
"""
