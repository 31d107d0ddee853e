from trainer import MARKER, gate_seen


def test_where_the_gate_shows(request, tmp_path):
    seen = gate_seen()
    config = request.config
    plugins = [f"{name} {type(plugin).__module__}" for name, plugin in config.pluginmanager.list_name_plugin()]
    places = {"pytest arguments": " ".join(map(str, config.invocation_params.args)), "tmp_path": str(tmp_path), "plugins": " ".join(plugins)}
    seen += [where for where, text in places.items() if MARKER in text.lower()]
    assert not seen, f"the gate shows in: {', '.join(seen)}"
