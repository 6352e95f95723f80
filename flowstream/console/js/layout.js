// Layered layout of a directed graph, top to bottom, with no library:
//  1. back edges (cycles) are found by an iterative depth-first search and left out;
//  2. each node's layer is its longest path from a source (Kahn order);
//  3. the order within each layer is improved by barycentric sweeps (down, then up),
//     which untangles fan-outs and joins;
//  4. x positions: each node centred under its predecessors, pushed aside only as far
//     as its neighbours need.
// Linear in nodes + edges per sweep, so a 1,000-node graph lays out in milliseconds.

export const NODE_HEIGHT = 30;
const LAYER_GAP = 40;
const NODE_GAP = 24;
const MARGIN = 20;
const CHAR_WIDTH = 7;
export const MAX_LABEL = 28; // characters shown in a node; the full label is in its tooltip

export function nodeWidth(label) {
  return Math.max(48, Math.min(String(label).length, MAX_LABEL) * CHAR_WIDTH + 20);
}

/**
 * nodes: [{id, label}], edges: [{from, to}] -> {nodes: Map(id -> {x, y, width, height,
 * layer, order}), width, height, backEdges: Set of edge indexes}. Edges naming an unknown
 * node are ignored.
 */
export function layout(nodes, edges, sweeps = 4) {
  const ids = nodes.map((n) => String(n.id));
  const index = new Map(ids.map((id, i) => [id, i]));
  const n = ids.length;
  const out = Array.from({ length: n }, () => []);
  const inc = Array.from({ length: n }, () => []);
  const usable = [];
  edges.forEach((edge, i) => {
    const a = index.get(String(edge.from));
    const b = index.get(String(edge.to));
    if (a === undefined || b === undefined || a === b) return;
    usable.push([a, b, i]);
  });
  const back = backEdges(n, usable);
  for (const [a, b, i] of usable) {
    if (back.has(i)) continue;
    out[a].push(b);
    inc[b].push(a);
  }

  // Longest-path layering in topological (Kahn) order.
  const layerOf = new Array(n).fill(0);
  const waiting = inc.map((list) => list.length);
  const queue = [];
  for (let v = 0; v < n; v++) if (waiting[v] === 0) queue.push(v);
  for (let head = 0; head < queue.length; head++) {
    const v = queue[head];
    for (const w of out[v]) {
      layerOf[w] = Math.max(layerOf[w], layerOf[v] + 1);
      if (--waiting[w] === 0) queue.push(w);
    }
  }
  const layers = [];
  for (const v of queue) (layers[layerOf[v]] ||= []).push(v);

  // Barycentric ordering: a node's place is the mean place of its neighbours in the
  // layers already ordered (predecessors going down, successors going up).
  const pos = new Float64Array(n);
  const place = () => layers.forEach((layer) => layer.forEach((v, i) => { pos[v] = i; }));
  place();
  const sortBy = (layer, neighbours) => {
    const key = new Map();
    for (const v of layer) {
      const list = neighbours[v];
      let sum = 0;
      for (const w of list) sum += pos[w];
      key.set(v, list.length ? sum / list.length : pos[v]);
    }
    layer.sort((a, b) => key.get(a) - key.get(b) || pos[a] - pos[b]);
    layer.forEach((v, i) => { pos[v] = i; });
  };
  for (let s = 0; s < sweeps; s++) {
    for (let l = 1; l < layers.length; l++) sortBy(layers[l], inc);
    for (let l = layers.length - 2; l >= 0; l--) sortBy(layers[l], out);
  }

  // Coordinates: each node wants to sit centred under its predecessors (a chain stays a
  // straight column, a fan-out spreads under its source); in a layer, left to right,
  // a node is pushed right just enough to clear its neighbour, then the whole layer
  // moves back by the mean push, so it stays centred on what it hangs from.
  const widths = nodes.map((node) => nodeWidth(node.label ?? node.id));
  const centre = new Float64Array(n);
  layers.forEach((layer) => {
    const wanted = layer.map((v) => {
      const preds = inc[v];
      if (!preds.length) return NaN;
      let sum = 0;
      for (const w of preds) sum += centre[w];
      return sum / preds.length;
    });
    // Nodes with no predecessor (the first layer, or a source further down) pack from 0.
    let left = 0;
    const lefts = layer.map((v, i) => {
      const want = Number.isNaN(wanted[i]) ? left : wanted[i] - widths[v] / 2;
      const at = Math.max(want, left);
      left = at + widths[v] + NODE_GAP;
      return at;
    });
    let push = 0;
    let counted = 0;
    layer.forEach((v, i) => {
      if (!Number.isNaN(wanted[i])) {
        push += lefts[i] + widths[v] / 2 - wanted[i];
        counted++;
      }
    });
    const back = counted ? push / counted : 0;
    layer.forEach((v, i) => { centre[v] = lefts[i] - back + widths[v] / 2; });
  });
  let minX = Infinity;
  let maxX = -Infinity;
  for (let v = 0; v < n; v++) {
    minX = Math.min(minX, centre[v] - widths[v] / 2);
    maxX = Math.max(maxX, centre[v] + widths[v] / 2);
  }
  if (!n) minX = maxX = 0;
  const placed = new Map();
  layers.forEach((layer, l) => {
    const y = MARGIN + l * (NODE_HEIGHT + LAYER_GAP);
    layer.forEach((v, order) => {
      const x = MARGIN + centre[v] - widths[v] / 2 - minX;
      placed.set(ids[v], { x, y, width: widths[v], height: NODE_HEIGHT, layer: l, order });
    });
  });
  const widest = maxX - minX;
  return {
    nodes: placed,
    width: widest + 2 * MARGIN,
    height: layers.length * (NODE_HEIGHT + LAYER_GAP) - LAYER_GAP + 2 * MARGIN,
    layers: layers.length,
    backEdges: back,
  };
}

/** Indexes of the edges that close a cycle (iterative DFS: no recursion limit). */
function backEdges(n, usable) {
  const next = Array.from({ length: n }, () => []);
  for (const [a, b, i] of usable) next[a].push([b, i]);
  const colour = new Uint8Array(n); // 0 new, 1 on the stack, 2 done
  const back = new Set();
  for (let root = 0; root < n; root++) {
    if (colour[root]) continue;
    const stack = [[root, 0]];
    colour[root] = 1;
    while (stack.length) {
      const top = stack[stack.length - 1];
      const [v, k] = top;
      if (k < next[v].length) {
        top[1] = k + 1;
        const [w, i] = next[v][k];
        if (colour[w] === 1) back.add(i);
        else if (colour[w] === 0) {
          colour[w] = 1;
          stack.push([w, 0]);
        }
      } else {
        colour[v] = 2;
        stack.pop();
      }
    }
  }
  return back;
}

/** Number of pairs of edges between adjacent layers that cross (a layout quality check). */
export function crossings(result, edges) {
  const spans = [];
  for (const edge of edges) {
    const a = result.nodes.get(String(edge.from));
    const b = result.nodes.get(String(edge.to));
    if (a && b && b.layer === a.layer + 1) spans.push([a.layer, a.order, b.order]);
  }
  let count = 0;
  for (let i = 0; i < spans.length; i++) {
    for (let j = i + 1; j < spans.length; j++) {
      const [l1, a1, b1] = spans[i];
      const [l2, a2, b2] = spans[j];
      if (l1 === l2 && (a1 - a2) * (b1 - b2) < 0) count++;
    }
  }
  return count;
}
