"""The rank-groups figure's command: the layout printed as ``comm.groups`` prints it, the
figure saved; a layout with context parallelism is refused (the figure has no cp axis)."""
import pytest

from reference_impl.comm.groups import main as print_layout
from reference_impl.figures.rank_groups import main


def test_prints_the_layout_and_saves_the_figure(tmp_path, capsys):
    arguments = ["--world-size", "8", "--tp", "2", "--pp", "2", "--order", "megatron"]
    print_layout(arguments)
    printed = capsys.readouterr().out
    main([*arguments, "--plot", str(tmp_path / "groups.png")])
    out = capsys.readouterr().out
    assert out.startswith(printed)
    assert out.endswith(f"figure saved to {tmp_path / 'groups.png'}\n")
    assert (tmp_path / "groups.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("arguments, message", [
    (["--world-size", "8", "--cp", "2", "--plot", "x.png"], "--cp 2 has no figure"),
    (["--world-size", "6", "--tp", "4", "--plot", "x.png"], "not divisible"),
    (["--world-size", "8"], "--plot"),
])
def test_refuses_what_it_cannot_draw(arguments, message, capsys):
    with pytest.raises(SystemExit):
        main(arguments)
    assert message in capsys.readouterr().err
