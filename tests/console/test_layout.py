"""The console's graph layout (flowstream/console/js/layout.js), run in the real browser."""

from __future__ import annotations

from typing import Any

import pytest

# A page of the console's origin that imports the layout module and runs it on a graph.
RUN = """async ([nodes, edges, sweeps]) => {
  const m = await import('/js/layout.js');
  const t0 = performance.now();
  const r = m.layout(nodes, edges, sweeps);
  const ms = performance.now() - t0;
  return {ms, width: r.width, height: r.height, layers: r.layers, back: [...r.backEdges],
          crossings: m.crossings(r, edges),
          nodes: Object.fromEntries([...r.nodes].map(([id, p]) => [id, p]))};
}"""


def run_layout(page: Any, url: str, nodes: list, edges: list, sweeps: int = 4) -> dict:
    page.goto(f"{url}/js/layout.js")  # any page of the origin: the module is imported
    return page.evaluate(RUN, [nodes, edges, sweeps])


def wide_graph(n: int) -> tuple[list[dict], list[dict]]:
    """A fan-out of chains joined at the end, with cross links: about ``n`` nodes."""
    nodes = [{"id": "0", "label": "start"}]
    edges = []
    width = 25
    depth = (n - 2) // width
    for c in range(width):
        for d in range(depth):
            node = f"{c}-{d}"
            nodes.append({"id": node, "label": f"task:step-{c}-{d}"})
            edges.append({"from": "0" if d == 0 else f"{c}-{d - 1}", "to": node})
            if d and c % 3 == 0:
                edges.append({"from": f"{(c * 7) % width}-{d - 1}", "to": node})
    nodes.append({"id": "end", "label": "end"})
    edges += [{"from": f"{c}-{depth - 1}", "to": "end"} for c in range(width)]
    return nodes, edges


def test_a_thousand_node_graph_lays_out_quickly_with_every_edge_pointing_down(
    page: Any, static_console: str
) -> None:
    nodes, edges = wide_graph(1000)
    result = run_layout(page, static_console, nodes, edges)
    placed = result["nodes"]
    assert len(placed) == len(nodes)
    assert all(placed[e["to"]]["layer"] > placed[e["from"]]["layer"] for e in edges)
    assert result["back"] == []
    # Generous for a loaded 2-core CI machine; it takes a few ms on a laptop.
    assert result["ms"] < 1500, result["ms"]


def test_nodes_of_a_layer_never_overlap(page: Any, static_console: str) -> None:
    nodes, edges = wide_graph(300)
    placed = run_layout(page, static_console, nodes, edges)["nodes"]
    by_layer: dict[int, list[dict]] = {}
    for box in placed.values():
        by_layer.setdefault(box["layer"], []).append(box)
    for boxes in by_layer.values():
        boxes.sort(key=lambda b: b["x"])
        for left, right in zip(boxes, boxes[1:], strict=False):
            assert left["x"] + left["width"] <= right["x"]


def test_layers_are_longest_paths_from_the_start(page: Any, static_console: str) -> None:
    # a -> b -> c -> d and a shortcut a -> d: d sits below c, not beside b.
    nodes = [{"id": x, "label": x} for x in "abcd"]
    edges = [{"from": a, "to": b} for a, b in ("ab", "bc", "cd", "ad")]
    placed = run_layout(page, static_console, nodes, edges)["nodes"]
    assert [placed[x]["layer"] for x in "abcd"] == [0, 1, 2, 3]


def test_barycentric_sweeps_untangle_crossed_fan_outs(page: Any, static_console: str) -> None:
    # x joins p and q; in first-come order it lands right of q's own child qa, so p -> x
    # crosses q -> qa. Its barycentre puts it between them.
    nodes = [{"id": x, "label": x} for x in ["p", "q", "pb", "qa", "x"]]
    pairs = [("p", "pb"), ("p", "x"), ("q", "qa"), ("q", "x")]
    edges = [{"from": a, "to": b} for a, b in pairs]
    unsorted = run_layout(page, static_console, nodes, edges, 0)
    sorted_ = run_layout(page, static_console, nodes, edges, 4)
    assert unsorted["crossings"] > 0
    assert sorted_["crossings"] == 0


@pytest.mark.parametrize("size", [3, 400])
def test_a_cycle_is_drawn_with_its_closing_edge_left_out_of_the_layering(
    page: Any, static_console: str, size: int
) -> None:
    nodes = [{"id": str(i), "label": str(i)} for i in range(size)]
    edges = [{"from": str(i), "to": str((i + 1) % size)} for i in range(size)]
    result = run_layout(page, static_console, nodes, edges)
    assert result["back"] == [size - 1]
    assert result["layers"] == size


DRAW = """async ([nodes, edges]) => {
  const { GraphView } = await import('/js/graph.js');
  document.body.innerHTML = '<div id="box" tabindex="0"></div><span id="zoom"></span>';
  Object.assign(document.getElementById('box').style,
                {height: '500px', width: '900px', overflow: 'auto'});
  const box = document.getElementById('box');
  const view = new GraphView(box, document.getElementById('zoom'), () => {});
  const t0 = performance.now();
  view.show({nodes, edges});
  await new Promise(requestAnimationFrame);
  const ms = performance.now() - t0;
  const before = box.querySelector('svg').getAttribute('width');
  box.focus();
  box.dispatchEvent(new KeyboardEvent('keydown', {key: '+', bubbles: true}));
  const after = box.querySelector('svg').getAttribute('width');
  // A second show with new states recolours in place: the same elements stay.
  const first = box.querySelector('.node');
  view.show({nodes: nodes.map(n => ({...n, state: 'ended'})), edges});
  return {ms, drawn: box.querySelectorAll('.node').length, before: +before, after: +after,
          kept: first === box.querySelector('.node'),
          ended: box.querySelectorAll('.node.st-ended').length};
}"""


def test_a_thousand_node_graph_is_drawn_zoomable_and_recoloured_in_place(
    page: Any, static_console: str
) -> None:
    nodes, edges = wide_graph(1000)
    for node in nodes:
        node["kind"] = "task"
    page.goto(f"{static_console}/js/graph.js")
    result = page.evaluate(DRAW, [nodes, edges])
    assert result["drawn"] == len(nodes)
    assert result["after"] > result["before"]  # '+' zoomed in
    assert result["kept"] and result["ended"] == len(nodes)
    assert result["ms"] < 3000, result["ms"]


def test_a_chain_is_a_straight_column_and_a_fan_out_is_centred_under_its_source(
    page: Any, static_console: str
) -> None:
    labels = {"a": "a", "b": "a much longer label", "c": "c", "x": "x", "y": "y", "z": "z"}
    nodes = [{"id": k, "label": v} for k, v in labels.items()]
    pairs = [("a", "b"), ("b", "c"), ("c", "x"), ("c", "y"), ("c", "z")]
    placed = run_layout(page, static_console, nodes, [{"from": a, "to": b} for a, b in pairs])
    middle = {k: p["x"] + p["width"] / 2 for k, p in placed["nodes"].items()}
    assert middle["a"] == pytest.approx(middle["b"]) == pytest.approx(middle["c"])
    assert middle["x"] < middle["y"] < middle["z"]
    assert (middle["x"] + middle["z"]) / 2 == pytest.approx(middle["c"])
