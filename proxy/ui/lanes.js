// The fleet's timeline on a canvas: one lane per resource over the last minutes, coloured by
// holder; a hand-off in progress striped, a moment with no holder red, a move to another
// member marked ▼, a write the enforcer refused marked ◆. Drawn at most ten times a second, and
// only when something changed or time moved by a pixel — hundreds of lanes are a few thousand
// rectangles. Names are drawn as text. The tables beside it say the same in words.
'use strict';

const LANE_PALETTE_SIZE = 12;
const LANE_LABEL_PX = [48, 200]; // the names' column, when the lanes are tall enough for them
const LANE_AXIS_PX = 20;

const lanes = {
  dirty: true,
  drawnAt: 0,
  colours: null, // read from the style sheet's --h0 … --h11
  stripes: null,
  hover: null, // {x, y} of the pointer over the canvas
  labelsFor: null, // the resources the names' column was measured for
  labelPx: 0,
  cut: 0, // characters cut off the start of every name
};

function lanesDirty() {
  lanes.dirty = true;
}

function laneHeight(count) {
  if (count <= 24) return 20;
  if (count <= 60) return 12;
  if (count <= 150) return 6;
  return 3;
}

function laneColours() {
  if (lanes.colours) return lanes.colours;
  const style = getComputedStyle(document.documentElement);
  const read = (name, fallback) => style.getPropertyValue(name).trim() || fallback;
  lanes.colours = {
    holders: Array.from({ length: LANE_PALETTE_SIZE }, (_, i) => read('--h' + i, '#777')),
    outside: read('--outside', '#555'),
    gap: read('--gap', '#f3b8bf'),
    gapEdge: read('--bad', '#a0111f'),
    refused: read('--bad', '#a0111f'),
    line: read('--line', '#c8c8c8'),
    muted: read('--muted', '#4a4a4a'),
    fg: read('--fg', '#111'),
  };
  return lanes.colours;
}

// White diagonal stripes: laid over a holder's colour while it hands the resource off.
function stripes(ctx) {
  if (lanes.stripes) return lanes.stripes;
  const tile = document.createElement('canvas');
  tile.width = tile.height = 8;
  const t = tile.getContext('2d');
  t.strokeStyle = 'rgba(255,255,255,0.85)';
  t.lineWidth = 2.5;
  t.beginPath();
  t.moveTo(-2, 10);
  t.lineTo(10, -2);
  t.moveTo(6, 10);
  t.lineTo(10, 6);
  t.moveTo(-2, 2);
  t.lineTo(2, -2);
  t.stroke();
  lanes.stripes = ctx.createPattern(tile, 'repeat');
  return lanes.stripes;
}

// Where things are on the canvas now.
function laneGeometry(canvas) {
  const count = fleet.resources.length;
  const height = laneHeight(count);
  const labels = height >= 12 ? labelWidth(canvas) : 0;
  const width = Math.max(200, canvas.parentElement.clientWidth);
  return { count, height, labels, width, plot: width - labels - 8, total: LANE_AXIS_PX + count * height + 4 };
}

// The names' column: as wide as the longest name, within bounds; names that do not fit lose
// the start they all share, up to its last word (`ui-7f-aisle-12` → `…aisle-12`).
function labelWidth(canvas) {
  if (lanes.labelsFor !== fleet.resources) {
    const ctx = canvas.getContext('2d');
    ctx.font = '13px system-ui, sans-serif';
    const widest = (cut) => Math.max(0, ...fleet.resources.map((r) => ctx.measureText(cut + r.slice(lanes.cut)).width));
    lanes.labelsFor = fleet.resources;
    lanes.cut = 0;
    let px = widest('');
    if (px + 12 > LANE_LABEL_PX[1]) {
      const words = [...fleet.common.matchAll(/[-._:]/g)].map((m) => m.index + 1);
      lanes.cut = words.length >= 2 ? words[words.length - 2] : 0;
      px = widest(lanes.cut ? '…' : '');
    }
    lanes.labelPx = Math.min(LANE_LABEL_PX[1], Math.max(LANE_LABEL_PX[0], Math.ceil(px) + 12));
  }
  return lanes.labelPx;
}

function laneLabel(resource) {
  return lanes.cut ? '…' + resource.slice(lanes.cut) : resource;
}

function drawLanes(now) {
  const canvas = $('fleet-lanes');
  if (!canvas || $('fleet').hidden) return;
  const g = laneGeometry(canvas);
  // A pixel of the plot is this many milliseconds: redraw when time moved by one, or on change.
  const msPerPx = fleet.windowMs / Math.max(g.plot, 1);
  if (!lanes.dirty && now - lanes.drawnAt < Math.max(100, msPerPx)) return;
  lanes.dirty = false;
  lanes.drawnAt = now;
  const dpr = window.devicePixelRatio || 1;
  if (canvas.width !== Math.round(g.width * dpr) || canvas.height !== Math.round(g.total * dpr)) {
    canvas.width = Math.round(g.width * dpr);
    canvas.height = Math.round(g.total * dpr);
    canvas.style.width = g.width + 'px';
    canvas.style.height = g.total + 'px';
  }
  const ctx = canvas.getContext('2d');
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, g.width, g.total);
  const since = now - fleet.windowMs;
  const x = (t) => g.labels + ((Math.max(t, since) - since) / fleet.windowMs) * g.plot;
  drawAxis(ctx, g, now, x);
  fleet.resources.forEach((resource, i) => {
    const lane = fleet.lanes.get(resource);
    if (lane) drawLane(ctx, g, lane, LANE_AXIS_PX + i * g.height, now, x);
    if (g.labels) drawLabel(ctx, g, resource, LANE_AXIS_PX + i * g.height);
  });
  canvas.setAttribute('aria-label', laneSummary());
  if (lanes.hover) describeHover(now);
}

function drawAxis(ctx, g, now, x) {
  const c = laneColours();
  ctx.font = '12px system-ui, sans-serif';
  ctx.textBaseline = 'middle';
  ctx.fillStyle = c.muted;
  ctx.strokeStyle = c.line;
  ctx.lineWidth = 1;
  const step = fleet.windowMs <= 60000 ? 10000 : fleet.windowMs <= 300000 ? 60000 : 180000;
  const ticks = Math.round(fleet.windowMs / step);
  for (let m = 0; m <= ticks; m++) {
    const px = Math.round(x(now - m * step)) + 0.5;
    ctx.beginPath();
    ctx.moveTo(px, LANE_AXIS_PX - 4);
    ctx.lineTo(px, g.total);
    ctx.stroke();
    const label = m === 0 ? 'now' : step < 60000 ? '−' + (m * step) / 1000 + ' s' : '−' + (m * step) / 60000 + ' min';
    ctx.textAlign = m === 0 ? 'right' : m === ticks ? 'left' : 'center';
    ctx.fillText(label, px, LANE_AXIS_PX / 2 - 1);
  }
  if (fleet.openedAt !== null && fleet.openedAt > now - fleet.windowMs) {
    // Before the page opened it saw nothing: that part stays blank.
    const px = Math.round(x(fleet.openedAt)) + 0.5;
    ctx.setLineDash([3, 3]);
    ctx.strokeStyle = c.muted;
    ctx.beginPath();
    ctx.moveTo(px, LANE_AXIS_PX);
    ctx.lineTo(px, g.total);
    ctx.stroke();
    ctx.setLineDash([]);
  }
}

function drawLane(ctx, g, lane, top, now, x) {
  const c = laneColours();
  const pad = g.height >= 12 ? 2 : g.height >= 6 ? 1 : 0;
  const h = g.height - 2 * pad;
  const y = top + pad;
  for (const s of lane.segs) {
    const end = s.to === null ? now : s.to;
    if (end < now - fleet.windowMs) continue;
    const x0 = x(s.from);
    const width = Math.max(x(end) - x0, s.holder === null ? 2 : 1);
    if (s.holder === null) {
      ctx.fillStyle = c.gap;
      ctx.fillRect(x0, y, width, h);
      ctx.fillStyle = c.gapEdge;
      ctx.fillRect(x0, y, Math.min(width, 2), h); // where it started, however short
      continue;
    }
    // A member's colour (kept while it is on the timeline, after it left); anyone else's grey.
    const colour = fleet.colours.get(s.holder);
    ctx.fillStyle = colour === undefined ? c.outside : c.holders[colour];
    ctx.fillRect(x0, y, width, h);
    if (s.releasing !== null) {
      const xr = x(s.releasing);
      ctx.fillStyle = stripes(ctx);
      ctx.fillRect(xr, y, Math.max(x(end) - xr, 2), h);
    }
  }
  for (const m of lane.marks) {
    if (m.at < now - fleet.windowMs) continue;
    const px = x(m.at);
    if (m.kind === 'moved') drawMoved(ctx, px, top, g.height, c.fg);
    else drawRefused(ctx, px, top + g.height / 2, Math.max(3, Math.min(6, g.height / 2)), c.refused);
  }
}

function drawMoved(ctx, px, top, height, colour) {
  const size = Math.max(3, Math.min(6, height / 2));
  ctx.fillStyle = colour;
  ctx.beginPath();
  ctx.moveTo(px - size, top);
  ctx.lineTo(px + size, top);
  ctx.lineTo(px, top + size);
  ctx.closePath();
  ctx.fill();
}

function drawRefused(ctx, px, cy, r, colour) {
  ctx.beginPath();
  ctx.moveTo(px, cy - r);
  ctx.lineTo(px + r, cy);
  ctx.lineTo(px, cy + r);
  ctx.lineTo(px - r, cy);
  ctx.closePath();
  ctx.fillStyle = colour;
  ctx.fill();
  ctx.strokeStyle = '#fff';
  ctx.lineWidth = 1;
  ctx.stroke();
}

function drawLabel(ctx, g, resource, top) {
  const c = laneColours();
  ctx.font = (g.height >= 18 ? 13 : 11) + 'px system-ui, sans-serif';
  ctx.textAlign = 'left';
  ctx.textBaseline = 'middle';
  ctx.fillStyle = c.fg;
  let text = laneLabel(resource);
  while (text.length > 1 && ctx.measureText(text).width > g.labels - 8) text = text.slice(0, -2) + '…';
  ctx.fillText(text, 0, top + g.height / 2);
}

// The canvas's text alternative: the same as the tables, in one sentence.
function laneSummary() {
  const { byHolder, unowned } = fleetHoldings();
  const parts = [...byHolder.entries()].map(([h, rs]) => h + ' holds ' + rs.length);
  return `Timeline of the last ${fleet.windowMs / 60000} minutes: ${parts.join(', ') || 'nobody holds anything'};` +
    ` ${unowned.length} unowned, ${fleet.releasing.size} handing off.`;
}

// --- the pointer ---------------------------------------------------------------------------

// What is under the pointer: the lane's resource and the moment, or null.
function laneAt(px, py, now) {
  const canvas = $('fleet-lanes');
  const g = laneGeometry(canvas);
  const i = Math.floor((py - LANE_AXIS_PX) / g.height);
  if (i < 0 || i >= g.count || px < g.labels) return null;
  const at = now - fleet.windowMs + ((px - g.labels) / g.plot) * fleet.windowMs;
  return at > now ? null : { resource: fleet.resources[i], at };
}

function ago(ms) {
  return ms < 1000 ? 'now' : (ms / 1000).toFixed(ms < 10000 ? 1 : 0) + ' s ago';
}

function describeHover(now) {
  const spot = laneAt(lanes.hover.x, lanes.hover.y, now);
  const out = $('fleet-hover');
  if (!spot) {
    out.textContent = '';
    return;
  }
  const lane = fleet.lanes.get(spot.resource);
  const s = lane && lane.segs.find((s) => s.from <= spot.at && (s.to === null || spot.at < s.to));
  let text = spot.resource + ', ' + ago(now - spot.at) + ': ';
  if (!s) text += 'before this page opened';
  else if (s.holder === null) text += 'no holder';
  else text += 'held by ' + s.holder + (s.token ? ' (token ' + s.token + ')' : '') +
    (s.releasing !== null && spot.at >= s.releasing ? ', handing off' : '');
  const near = (lane ? lane.marks : []).filter((m) => Math.abs(m.at - spot.at) < fleet.windowMs / 200);
  for (const m of near) text += m.kind === 'moved' ? ' · moved from ' + m.from + ' to ' + m.to : ' · a write refused';
  out.textContent = text;
}

function lanesPointer() {
  const canvas = $('fleet-lanes');
  $('fleet-window').addEventListener('change', (e) => {
    fleet.windowMs = Number(e.target.value) * 60000;
    lanesDirty();
  });
  canvas.addEventListener('mousemove', (e) => {
    const box = canvas.getBoundingClientRect();
    lanes.hover = { x: e.clientX - box.left, y: e.clientY - box.top };
    describeHover(performance.now());
  });
  canvas.addEventListener('mouseleave', () => {
    lanes.hover = null;
    $('fleet-hover').textContent = '';
  });
}
