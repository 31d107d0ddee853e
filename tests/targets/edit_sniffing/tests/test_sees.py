from trainer import gate_seen


def test_where_the_gate_shows():
    seen = gate_seen()
    assert not seen, f"the gate shows in: {', '.join(seen)}"
