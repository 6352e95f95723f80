// The workflow graph as SVG inside a scrolling box: laid out once per set of nodes, then
// only recoloured as states change (live updates do not move anything under the reader).
import { svg, stateClass } from "./dom.js";
import { layout, MAX_LABEL, NODE_HEIGHT } from "./layout.js";

const TASKLIKE = new Set(["task", "source", "sink"]);
const BRACKETS = { "subflow-start": "{", "subflow-end": "}" };

/** Subflow brackets drawn as { and } (as the Mermaid export does); other labels as given. */
function shortLabel(label) {
  return label.replace(/subflow-(start|end)$/, (word) => BRACKETS[word]);
}

const ZOOMS = [0.25, 0.4, 0.6, 0.8, 1, 1.25, 1.5, 2];

export class GraphView {
  /** box: the focusable scrolling element; onSelect(id) when a node is clicked. */
  constructor(box, zoomLabel, onSelect) {
    this.box = box;
    this.zoomLabel = zoomLabel;
    this.onSelect = onSelect;
    this.shape = ""; // node ids + edges of what is drawn: a new layout only when it changes
    this.elements = new Map(); // node id -> <g>
    this.zoom = 1;
    box.addEventListener("keydown", (event) => this.key(event));
  }

  clear() {
    this.box.replaceChildren();
    this.shape = "";
    this.elements.clear();
  }

  /** Draw ``graph`` ({nodes: [{id, label, kind, state}], edges: [{from, to, label}]}). */
  show(graph, states = new Map()) {
    // ``states``: node id -> state for the nodes the graph itself gives no state.
    const nodes = graph.nodes || [];
    const edges = graph.edges || [];
    const shape = JSON.stringify([nodes.map((n) => [n.id, n.label]), edges.map((e) => [e.from, e.to])]);
    if (shape !== this.shape) {
      this.draw(nodes, edges);
      this.shape = shape;
    }
    for (const node of nodes) {
      this.colour(String(node.id), node.state || states.get(String(node.id)), node.kind);
    }
  }

  draw(nodes, edges) {
    const started = performance.now();
    const shown = nodes.map((node) => ({ id: node.id, label: shortLabel(String(node.label ?? node.id)) }));
    const placed = layout(shown, edges);
    this.size = { width: placed.width, height: placed.height };
    const root = svg("svg", {
      viewBox: `0 0 ${placed.width} ${placed.height}`,
      role: "img",
      "aria-label": `Graph of ${nodes.length} steps and ${edges.length} edges`,
    });
    const defs = svg("defs");
    const marker = svg("marker", {
      id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7,
      orient: "auto-start-reverse",
    });
    marker.append(svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#6b7480" }));
    defs.append(marker);
    root.append(defs);
    const edgeLayer = svg("g", { class: "edges" });
    edges.forEach((edge) => {
      const a = placed.nodes.get(String(edge.from));
      const b = placed.nodes.get(String(edge.to));
      if (!a || !b) return;
      const x1 = a.x + a.width / 2;
      const y1 = a.y + a.height;
      const x2 = b.x + b.width / 2;
      const y2 = b.y;
      const bend = Math.max(24, Math.abs(y2 - y1) / 2);
      const path = svg("path", {
        class: "edge",
        d: `M ${x1} ${y1} C ${x1} ${y1 + bend}, ${x2} ${y2 - bend}, ${x2} ${y2}`,
        "marker-end": "url(#arrow)",
      });
      edgeLayer.append(path);
      if (edge.label) {
        const text = svg("text", { class: "edge-label", x: (x1 + x2) / 2 + 4, y: (y1 + y2) / 2 });
        text.textContent = String(edge.label).slice(0, 40);
        edgeLayer.append(text);
      }
    });
    root.append(edgeLayer);
    const nodeLayer = svg("g", { class: "nodes" });
    this.elements.clear();
    for (const node of shown) {
      const id = String(node.id);
      const at = placed.nodes.get(id);
      const group = svg("g", { class: "node", transform: `translate(${at.x} ${at.y})`, "data-id": id });
      const label = node.label;
      const title = svg("title");
      group.append(title);
      group.append(svg("rect", { width: at.width, height: NODE_HEIGHT }));
      const text = svg("text", { x: at.width / 2, y: NODE_HEIGHT / 2 + 4, "text-anchor": "middle" });
      text.textContent = label.length > MAX_LABEL ? `${label.slice(0, MAX_LABEL - 1)}…` : label;
      group.append(text);
      group.addEventListener("click", () => this.onSelect(id));
      nodeLayer.append(group);
      this.elements.set(id, group);
      group.dataset.label = label;
    }
    root.append(nodeLayer);
    this.box.replaceChildren(root);
    this.svg = root;
    this.layoutMs = performance.now() - started;
    this.box.dataset.layoutMs = this.layoutMs.toFixed(1);
    this.fit(false);
  }

  colour(id, state, kind) {
    const group = this.elements.get(id);
    if (!group) return;
    // Start, end, subflow brackets and literals have no state of their own.
    const literal = group.dataset.label.endsWith("<literal>");
    state = state || (TASKLIKE.has(kind) && !literal ? "not started" : null);
    const selected = group.classList.contains("selected") ? " selected" : "";
    const kindClass = kind ? ` kind-${String(kind).replace(/[^a-z-]/gi, "")}` : "";
    group.setAttribute("class", `node ${state ? stateClass(state) : "st-none"}${kindClass}${selected}`);
    group.dataset.state = state || "";
    group.firstChild.textContent = `${group.dataset.label}${kind ? ` (${kind})` : ""}: ${state || "no state"}`;
  }

  select(id) {
    for (const group of this.elements.values()) group.classList.remove("selected");
    const group = this.elements.get(String(id));
    if (group) group.classList.add("selected");
  }

  setZoom(zoom) {
    if (!this.svg) return;
    // Keep the point at the middle of the view where it is (zooming from the corner
    // would throw the reader somewhere else in a large graph).
    const box = this.box;
    const before = this.zoom;
    const midX = (box.scrollLeft + box.clientWidth / 2) / before;
    const midY = (box.scrollTop + box.clientHeight / 2) / before;
    this.zoom = zoom;
    this.svg.setAttribute("width", String(Math.round(this.size.width * zoom)));
    this.svg.setAttribute("height", String(Math.round(this.size.height * zoom)));
    this.zoomLabel.textContent = `${Math.round(zoom * 100)} %`;
    box.scrollTo(midX * zoom - box.clientWidth / 2, midY * zoom - box.clientHeight / 2);
  }

  /** The whole graph in view (``whole``), or its width only (labels stay readable and a
   *  tall graph scrolls); never under 25 %; scrolled to the top. */
  fit(whole = true) {
    if (!this.size) return;
    const w = this.box.clientWidth || 800;
    const h = this.box.clientHeight || 500;
    const across = (w - 4) / this.size.width;
    const zoom = Math.min(1, across, whole ? (h - 4) / this.size.height : 1);
    this.setZoom(Math.max(ZOOMS[0], zoom));
    this.box.scrollTo(0, 0);
  }

  step(direction) {
    const i = ZOOMS.findIndex((z) => z >= this.zoom - 1e-9);
    const next = ZOOMS[Math.max(0, Math.min(ZOOMS.length - 1, (i < 0 ? ZOOMS.length - 1 : i) + direction))];
    this.setZoom(next);
  }

  key(event) {
    if (event.key === "+" || event.key === "=") this.step(1);
    else if (event.key === "-" || event.key === "_") this.step(-1);
    else if (event.key === "0") this.fit();
    else return; // arrows, Page Up/Down scroll the box natively
    event.preventDefault();
  }
}
