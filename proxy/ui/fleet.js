// The fleet panel: a fleet's members, what each holds and hands off, what nobody holds, and a
// timeline of it (drawn by lanes.js).
//
// Live from GET /v1/fleets/{f}, polled with one request in flight, at most once a second (less
// often for big fleets), and from the fleet's own /v1/watch stream (on its resources' longest
// common prefix), so a grant or a release shows within a frame of its event and the poll brings
// what events do not say (members, states, weights, hand-offs). Each lane remembers the etcd
// revision it was last told about: an answer read at an older revision than an event already
// applied leaves that lane alone. Times are this browser's performance.now() when a change
// arrived — never the server's clock; a hand-off's time left is the fleet's drain_ms counted
// from when the page first saw it, so at most what the service allows.
'use strict';

const FLEET_KEPT_MS = 15 * 60 * 1000; // the timeline's longest span
const FLEET_POLL_MS = 1000; // per 1,000 resources, at most 5 s
const FLEET_NAMES_SHOWN = 12; // resource names per member's cell
const FLEET_UNASSIGNED_SHOWN = 60;

// aisle-2 before aisle-10.
const naturally = new Intl.Collator('en', { numeric: true });

const fleet = {
  name: '',
  running: false,
  generation: 0, // bumped to end the fleet's poll and stream
  controller: null,
  view: null, // the last answer of GET /v1/fleets/{f}
  members: new Set(), // the members it named
  resources: [], // lane order: the fleet's resources, aisle-2 before aisle-10
  common: '', // what every resource's name starts with
  lanes: new Map(), // resource -> {segs: [{holder|null, token|null, from, to|null, releasing}], marks, revision}
  releasing: new Map(), // resource -> {member, deadline}
  colours: new Map(), // holder -> palette index
  openedAt: null,
  prefix: null, // the stream's prefix
  streamGeneration: 0,
  retryMs: 1000,
  resync: false, // events were lost: the next answer is taken whole
  polled: 'connecting…',
  streamed: 'connecting…',
  renderQueued: false,
  windowMs: 5 * 60 * 1000, // the timeline's span
};

// Shows `name`'s fleet ('' hides the panel).
function showFleet(name) {
  fleetStop();
  fleet.name = name;
  $('fleet').hidden = !name;
  $('fleet-label').textContent = name;
  if (name) fleetEnsure();
}

// Starts the poll for the fleet named, unless it runs.
function fleetEnsure() {
  if (!fleet.name || fleet.running) return;
  fleet.running = true;
  fleet.controller = new AbortController();
  fleetPill('poll', 'connecting…');
  fleetPoll(fleet.generation, fleet.controller.signal);
}

// Ends the poll and the stream and forgets what they said.
function fleetStop() {
  fleet.generation++;
  fleet.streamGeneration++;
  if (fleet.controller) fleet.controller.abort();
  fleet.running = false;
  fleet.view = null;
  fleet.members = new Set();
  fleet.resources = [];
  fleet.lanes.clear();
  fleet.releasing.clear();
  fleet.colours.clear();
  fleet.openedAt = null;
  fleet.prefix = null;
  fleetRender();
}

async function fleetPoll(generation, signal) {
  while (generation === fleet.generation) {
    let wait = FLEET_POLL_MS;
    try {
      const view = await getJson('/v1/fleets/' + encodeURIComponent(fleet.name), signal);
      if (generation !== fleet.generation) return;
      fleetApplyView(view, performance.now());
      fleetPill('poll', 'ok');
      wait = Math.min(5000, FLEET_POLL_MS * Math.max(1, fleet.resources.length / 1000));
    } catch (e) {
      if (signal.aborted || generation !== fleet.generation) return;
      if (e instanceof Refused && e.status === 401) return; // asked for a token: stopped
      const missing = e instanceof Refused && e.status === 404;
      // Not the refusal's detail: it may name a resource this caller may not read.
      fleetPill('poll', missing ? 'no such fleet' : e instanceof Refused && e.status === 403
        ? 'not allowed to read it' : (e instanceof Refused ? 'refused: ' : 'unreachable: ') + e.message);
      if (missing) fleetMissing();
      wait = 2000;
    }
    await sleep(document.hidden ? Math.max(wait, 5000) : wait);
  }
}

// The fleet is gone (or not made yet): what it held stays on the timeline, closed now.
function fleetMissing() {
  const at = performance.now();
  for (const lane of fleet.lanes.values()) laneSwitch(lane, null, null, at);
  fleet.view = null;
  fleet.releasing.clear();
  fleetRender();
}

// Takes in one answer of GET /v1/fleets/{f}, arrived at `at`.
function fleetApplyView(view, at) {
  const revision = Number(view.revision) || 0;
  const members = Array.isArray(view.members) ? view.members : [];
  const holder = new Map();
  const releasingBy = new Map();
  for (const m of members) {
    for (const r of m.held || []) holder.set(String(r), String(m.member));
    for (const r of m.releasing || []) {
      holder.set(String(r), String(m.member));
      releasingBy.set(String(r), String(m.member));
    }
  }
  fleet.view = view;
  fleet.members = new Set(members.map((m) => String(m.member)));
  fleet.resources = (Array.isArray(view.resources) ? view.resources : []).map(String).sort(naturally.compare);
  fleet.common = commonPrefix(fleet.resources);
  if (fleet.openedAt === null) fleet.openedAt = at;
  const wanted = new Set(fleet.resources);
  for (const r of [...fleet.lanes.keys()]) {
    if (!wanted.has(r)) {
      fleet.lanes.delete(r);
      fleet.releasing.delete(r);
    }
  }
  const drainMs = Number(view.drain_ms) || 0;
  for (const r of fleet.resources) {
    let lane = fleet.lanes.get(r);
    if (!lane) {
      lane = { segs: [], marks: [], revision: 0 };
      fleet.lanes.set(r, lane);
    }
    if (lane.revision > revision) continue; // an event newer than this answer was applied
    lane.revision = revision;
    const want = holder.get(r) ?? null;
    const open = lane.segs[lane.segs.length - 1];
    // A resource held outside the fleet is listed unassigned: its holder (from an event) stays.
    // A member's is not (one with a colour, gone from this answer: its grants ended with it).
    const outside = open && open.holder !== null && want === null && !fleet.colours.has(open.holder);
    if (!open || (open.holder !== want && !(outside && !fleet.resync))) laneSwitch(lane, want, null, at);
    const by = releasingBy.get(r);
    const current = lane.segs[lane.segs.length - 1];
    if (by) {
      if (current.releasing === null) current.releasing = at;
      const known = fleet.releasing.get(r);
      if (!known || known.member !== by) fleet.releasing.set(r, { member: by, deadline: at + drainMs });
    } else {
      fleet.releasing.delete(r);
    }
  }
  fleet.resync = false;
  for (const m of fleet.members) colourOf(m);
  fleetStream();
  fleetRender();
}

// Ends the lane's open stretch at `at` and opens one held by `holder` (null: nobody).
function laneSwitch(lane, holder, token, at) {
  const open = lane.segs[lane.segs.length - 1];
  if (open && open.holder === holder && (token === null || open.token === null || open.token === token)) {
    if (token !== null) open.token = token;
    return;
  }
  if (open) open.to = at;
  if (holder !== null) {
    let previous = null;
    for (let i = lane.segs.length - 1; i >= 0 && previous === null; i--) previous = lane.segs[i].holder;
    if (previous !== null && previous !== holder) lane.marks.push({ at, kind: 'moved', from: previous, to: holder });
  }
  lane.segs.push({ holder, token, from: at, to: null, releasing: null });
}

// One ownership event of the fleet's stream, arrived at `at`.
function fleetEvent(event, at) {
  const lane = fleet.lanes.get(event.resource);
  if (!lane) return;
  const revision = Number(event.revision) || 0;
  if (revision <= lane.revision) return; // the last answer already said so
  lane.revision = revision;
  const token = String(event.token);
  const open = lane.segs[lane.segs.length - 1];
  if (event.type === 'acquired') {
    const holder = String(event.holder);
    laneSwitch(lane, holder, token, at);
    const moving = fleet.releasing.get(event.resource);
    if (moving && moving.member !== holder) fleet.releasing.delete(event.resource);
  } else if (event.type === 'released' || event.type === 'expired') {
    if (!open || open.holder === null || (open.token !== null && open.token !== token)) return;
    laneSwitch(lane, null, null, at);
    fleet.releasing.delete(event.resource);
  } else {
    return;
  }
  fleetRender();
}

// A write the enforcer refused, `ageMs` before it was read at `at`.
function fleetRefusal(resource, at) {
  const lane = fleet.lanes.get(resource);
  if (!lane) return;
  lane.marks.push({ at, kind: 'refused' });
  lanesDirty();
}

// --- the fleet's event stream ----------------------------------------------------------------

function commonPrefix(names) {
  if (!names.length) return '';
  let prefix = names[0];
  for (const n of names) {
    let i = 0;
    while (i < prefix.length && i < n.length && prefix[i] === n[i]) i++;
    prefix = prefix.slice(0, i);
  }
  return prefix;
}

// (Re)starts the stream when the fleet's resources call for another prefix.
function fleetStream() {
  const prefix = fleet.common;
  if (prefix === fleet.prefix || !fleet.resources.length) return;
  fleet.prefix = prefix;
  fleet.streamGeneration++;
  fleetWatch(fleet.generation, fleet.streamGeneration, fleet.controller.signal);
}

async function fleetWatch(generation, mine, signal) {
  const current = () => generation === fleet.generation && mine === fleet.streamGeneration;
  let lastId = null;
  while (current()) {
    const extra = { Accept: 'text/event-stream' };
    if (lastId !== null) extra['Last-Event-ID'] = lastId;
    try {
      const path = '/v1/watch?prefix=' + encodeURIComponent(fleet.prefix);
      const resp = await fetch(path, { headers: headers(extra), cache: 'no-store', signal });
      if (!current()) return;
      if (resp.status === 401) {
        askForToken(await problemOf(resp));
        return;
      }
      if (resp.status === 410) {
        // Events were lost: from now on, and the next answer of the poll is taken whole.
        lastId = null;
        fleet.resync = true;
        continue;
      }
      if (!resp.ok) throw new Refused(resp.status, await problemOf(resp));
      fleetPill('stream', 'ok');
      await readSse(resp.body, current, (message) => {
        if (message.id !== null) lastId = message.id;
        const event = message.data ? ownershipEvent(message.data) : null;
        if (event) fleetEvent(event, performance.now());
      }, (ms) => {
        fleet.retryMs = ms;
      });
    } catch (e) {
      if (signal.aborted || !current()) return;
      fleetPill('stream', 'refused: ' + e.message);
    }
    if (!current()) return;
    if (fleet.streamed === 'ok') fleetPill('stream', 'reconnecting…');
    await sleep(fleet.retryMs);
  }
}

// The panel's pill: live when both the poll and the stream are.
function fleetPill(which, text) {
  if (which === 'poll') fleet.polled = text;
  else fleet.streamed = text;
  const bad = [fleet.polled, fleet.streamed].find((t) => t !== 'ok');
  if (bad === undefined) setPill('fleet-state', 'ok', 'live');
  else setPill('fleet-state', fleet.polled === 'ok' || bad.endsWith('…') ? 'warn' : 'bad',
    fleet.polled === 'ok' ? 'events: ' + bad : bad);
}

// --- colours -----------------------------------------------------------------------------

// A member's palette index: the lowest not taken by a member or one still on the timeline.
function colourOf(holder) {
  const known = fleet.colours.get(holder);
  if (known !== undefined) return known;
  const taken = new Set(fleet.colours.values());
  let i = 0;
  while (taken.has(i) && i < LANE_PALETTE_SIZE) i++;
  const index = i < LANE_PALETTE_SIZE ? i : fleet.colours.size % LANE_PALETTE_SIZE;
  fleet.colours.set(holder, index);
  return index;
}

// Frees the colours of holders that are neither members nor on the timeline any more.
function pruneColours() {
  const shown = new Set(fleet.members);
  for (const lane of fleet.lanes.values()) for (const s of lane.segs) if (s.holder !== null) shown.add(s.holder);
  for (const holder of [...fleet.colours.keys()]) if (!shown.has(holder)) fleet.colours.delete(holder);
}

// Drops what has left the timeline's window.
function fleetPrune(now) {
  const since = now - FLEET_KEPT_MS;
  for (const lane of fleet.lanes.values()) {
    while (lane.segs.length > 1 && lane.segs[0].to !== null && lane.segs[0].to < since) lane.segs.shift();
    while (lane.marks.length && lane.marks[0].at < since) lane.marks.shift();
  }
  pruneColours();
}

// --- tables --------------------------------------------------------------------------------

function fleetRender() {
  lanesDirty();
  if (fleet.renderQueued) return;
  fleet.renderQueued = true;
  requestAnimationFrame(() => {
    fleet.renderQueued = false;
    renderFleetTables();
  });
}

// What each holder holds now (per the lanes) and what nobody does.
function fleetHoldings() {
  const byHolder = new Map();
  const unowned = [];
  for (const r of fleet.resources) {
    const lane = fleet.lanes.get(r);
    const open = lane && lane.segs[lane.segs.length - 1];
    if (!open || open.holder === null) {
      unowned.push(r);
      continue;
    }
    if (!byHolder.has(open.holder)) byHolder.set(open.holder, []);
    byHolder.get(open.holder).push(r);
  }
  return { byHolder, unowned };
}

function swatch(holder) {
  const s = document.createElement('span');
  s.className = 'swatch h' + colourOf(holder);
  s.setAttribute('aria-hidden', 'true');
  return s;
}

function names(list, shown) {
  const text = list.slice(0, shown).join(', ');
  return list.length > shown ? text + ' … +' + (list.length - shown) : text;
}

function renderFleetTables() {
  const view = fleet.view;
  const { byHolder, unowned } = fleetHoldings();
  const members = view && Array.isArray(view.members) ? view.members : [];
  const rows = members.map((m) => {
    const member = String(m.member);
    const tr = document.createElement('tr');
    tr.dataset.member = member;
    const first = document.createElement('td');
    first.className = 'who';
    first.append(swatch(member), member);
    const held = (byHolder.get(member) || []).filter((r) => !fleet.releasing.has(r));
    const state = cell(String(m.state), 'state ' + String(m.state));
    tr.append(first, state, cell(String(m.weight), 'num'), cell(String(held.length), 'num'),
      cell(names(held, FLEET_NAMES_SHOWN) || '—', 'names'));
    tr.dataset.held = held.join(',');
    return tr;
  });
  $('fleet-members').tBodies[0].replaceChildren(...rows);
  $('fleet-members-empty').hidden = rows.length > 0;
  renderHandoffs();
  const outside = [...byHolder.keys()].filter((h) => !fleet.members.has(h));
  const list = $('fleet-unassigned');
  list.dataset.resources = unowned.join(',');
  list.textContent = unowned.length ? names(unowned, FLEET_UNASSIGNED_SHOWN) : 'none: every resource has a holder';
  for (const h of outside) list.append(' · held outside the fleet by ' + h + ': ' + names(byHolder.get(h), 8));
  $('fleet-unassigned-count').textContent = String(unowned.length);
  // Whose colours the timeline still shows, though they left.
  const former = [...fleet.colours.keys()].filter((h) => !fleet.members.has(h)).sort(naturally.compare);
  const left = $('fleet-former');
  left.replaceChildren(...(former.length ? ['Left the fleet: '] : []),
    ...former.flatMap((h, i) => [...(i ? [' · '] : []), swatch(h), h]));
  left.hidden = former.length === 0;
  const moving = fleet.releasing.size;
  $('fleet-summary').textContent = view
    ? `${fleet.resources.length} resources · ${members.length} members · ${moving} hand-off` +
      `${moving === 1 ? '' : 's'} in progress · ${unowned.length} unowned · drain ${Number(view.drain_ms) / 1000} s,` +
      ` at most ${view.max_moves} moves at once`
    : '';
}

function renderHandoffs() {
  const rows = [...fleet.releasing.entries()].sort((a, b) => naturally.compare(a[0], b[0])).map(([resource, r]) => {
    const tr = document.createElement('tr');
    tr.dataset.resource = resource;
    tr.dataset.member = r.member;
    const from = document.createElement('td');
    from.className = 'who';
    from.append(swatch(r.member), r.member);
    const bar = document.createElement('progress');
    bar.setAttribute('aria-label', 'Time left to hand off ' + resource);
    const left = document.createElement('span');
    left.className = 'left';
    const time = document.createElement('td');
    time.append(bar, ' ', left);
    r.row = { bar, left };
    tr.append(cell(resource), from, time);
    return tr;
  });
  $('fleet-handoffs').tBodies[0].replaceChildren(...rows);
  $('fleet-handoffs-empty').hidden = rows.length > 0;
  fleetCountdown(performance.now());
}

// Counts the hand-offs' time left down (called ten times a second).
function fleetCountdown(now) {
  const drainMs = fleet.view ? Number(fleet.view.drain_ms) || 0 : 0;
  for (const r of fleet.releasing.values()) {
    if (!r.row) continue;
    const left = Math.max(0, r.deadline - now);
    r.row.bar.max = Math.max(drainMs, 1);
    r.row.bar.value = Math.min(left, r.row.bar.max);
    r.row.bar.classList.toggle('low', left < drainMs / 4);
    const text = left > 0 ? '≤ ' + (left / 1000).toFixed(1) + ' s' : 'due';
    if (r.row.left.textContent !== text) r.row.left.textContent = text;
  }
}

let fleetPruned = 0;

// Ten times a second: the countdowns and the timeline.
function fleetTick(now) {
  if (!fleet.name) return;
  fleetCountdown(now);
  if (now - fleetPruned > 1000) {
    fleetPruned = now;
    fleetPrune(now);
  }
  drawLanes(now);
}
