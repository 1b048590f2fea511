"""A pytest run the kit starts loads its plugin once: by the entry point, or with -p where the
install registered none."""
from reference_impl.course import plugin_args


def test_the_entry_point_loads_the_plugin_here():
    assert plugin_args.plugin_args() == []


def test_without_an_entry_point_the_run_names_the_plugin(monkeypatch):
    monkeypatch.setattr(plugin_args, "entry_points", lambda group: [])
    assert plugin_args.plugin_args() == ["-p", plugin_args.PLUGIN]
