// lease-proxy's dashboard: who holds what under a prefix, for how long, and what happened.
//
// Live through GET /v1/watch read with fetch (an EventSource cannot send Authorization), resumed
// with Last-Event-ID after a dropped stream; the held set is listed once the stream has started,
// so no event between the list and the watch is lost. Time left is etcd's, asked with
// GET /v1/leases/{r} and counted down on performance.now() from when the request was sent —
// never wall-clock arithmetic against the server. Every name is shown as text, never as markup.
'use strict';

const TOKEN_KEY = 'lease-proxy.token';
const MAX_EVENTS = 500; // timeline entries kept
const MAX_HISTORY = 50; // tokens kept per resource
const MAX_REFRESHED = 200; // held rows whose time left is re-read each second (round robin)
const MAX_QUEUED = 10000; // events kept while the held set is listed; beyond, start again
const REFRESH_MS = 1000;
const READY_MS = 2000;

const $ = (id) => document.getElementById(id);

const state = {
  prefix: '',
  generation: 0, // bumped to end the current stream and its refreshes
  controller: null,
  lastId: null, // the last id of any message: where a resumed stream starts
  retryMs: 1000,
  reconnects: 0,
  listing: null, // the listing under way, {events: arriving meanwhile}, or null
  refreshing: -1, // the generation whose refresh loop runs
  toRead: new Set(), // resources whose time left to read first (new grants)
  cursor: 0, // where the round robin of re-reads goes on
  renderQueued: false,
  held: new Map(), // resource -> {holder, session, token, ttlMs, deadline, row}
  history: new Map(), // resource -> [{token, holder, ended}] newest first
  selected: null,
  signedIn: false,
};

function bearer() {
  return sessionStorage.getItem(TOKEN_KEY);
}

function headers(extra) {
  const h = Object.assign({ Accept: 'application/json' }, extra || {});
  const token = bearer();
  if (token) h.Authorization = 'Bearer ' + token;
  return h;
}

class Refused extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || 'HTTP ' + status);
    this.status = status;
    this.problem = problem;
  }
}

async function problemOf(resp) {
  try {
    return await resp.json();
  } catch (_) {
    return null;
  }
}

// A JSON GET of the proxy; 401 asks for a token.
async function getJson(path, signal) {
  const resp = await fetch(path, { headers: headers(), cache: 'no-store', signal });
  if (resp.ok) return resp.json();
  const problem = await problemOf(resp);
  if (resp.status === 401) askForToken(problem);
  throw new Refused(resp.status, problem);
}

function showProblem(text) {
  const p = $('problem');
  p.textContent = text || '';
  p.hidden = !text;
}

// Drops everything the page learnt with the current token.
function forget() {
  state.held.clear();
  state.history.clear();
  state.selected = null;
  $('history').hidden = true;
  $('timeline').replaceChildren();
  $('timeline-empty').hidden = false;
  $('refusals').replaceChildren();
  $('marks').tBodies[0].replaceChildren();
  renderRefusals();
  renderHeld();
  fleetStop();
}

function askForToken(problem) {
  state.generation++;
  if (state.controller) state.controller.abort();
  const refused = bearer();
  sessionStorage.removeItem(TOKEN_KEY);
  forget();
  $('auth').hidden = false;
  $('auth-why').textContent = refused
    ? 'The token was refused' + (problem && problem.detail ? ': ' + problem.detail : '.')
    : 'This proxy needs a bearer token.';
  setPill('stream', 'bad', 'signed out');
  $('token').focus();
}

function setPill(id, kind, text) {
  const pill = $(id);
  pill.className = 'pill ' + kind;
  pill.textContent = text;
}

// --- the event stream -------------------------------------------------------------------

function start() {
  state.generation++;
  if (state.controller) state.controller.abort();
  state.controller = new AbortController();
  state.lastId = null;
  state.held.clear();
  renderHeld();
  showProblem('');
  $('sign-out').hidden = !bearer();
  renderRefusals();
  watch(state.generation, state.controller.signal);
  fleetEnsure();
}

async function watch(generation, signal) {
  while (generation === state.generation) {
    const extra = {};
    if (state.lastId !== null) extra['Last-Event-ID'] = state.lastId;
    const fresh = state.lastId === null;
    try {
      const path = '/v1/watch?prefix=' + encodeURIComponent(state.prefix);
      const resp = await fetch(path, {
        headers: headers(Object.assign({ Accept: 'text/event-stream' }, extra)),
        cache: 'no-store',
        signal,
      });
      if (resp.status === 401) {
        askForToken(await problemOf(resp));
        return;
      }
      if (resp.status === 410) {
        // The resume point left etcd's history: list and watch again from now.
        note('resync', 'events compacted: listed again');
        state.lastId = null;
        continue;
      }
      if (!resp.ok) throw new Refused(resp.status, await problemOf(resp));
      showProblem('');
      setPill('stream', 'ok', streamText());
      await readStream(resp.body, generation, fresh);
    } catch (e) {
      if (signal.aborted || generation !== state.generation) return;
      if (e instanceof Refused && e.status === 403) {
        showProblem('Not allowed to read this prefix: ' + e.message);
        setPill('stream', 'bad', 'refused');
        return;
      }
      if (e instanceof Refused) showProblem('Event stream: ' + e.message);
    }
    if (generation !== state.generation) return;
    state.reconnects++;
    setPill('stream', 'warn', 'reconnecting (' + state.reconnects + ')…');
    await sleep(state.retryMs);
  }
}

function streamText() {
  if (state.reconnects === 0) return 'live';
  return 'live · resumed ' + state.reconnects + '× (from ' + (state.lastId || 'now') + ')';
}

// Reads the stream's messages until it ends: the first of a fresh stream starts the listing.
async function readStream(body, generation, fresh) {
  let first = true;
  await readSse(
    body,
    () => generation === state.generation,
    (message) => {
      if (message.id !== null) state.lastId = message.id;
      if (first && fresh) list(generation); // the stream has started: what is held now, then its events
      first = false;
      if (message.data) dispatch(message.data);
    },
    (ms) => {
      state.retryMs = ms;
    },
  );
}

function dispatch(data) {
  const event = ownershipEvent(data);
  if (event === null) return;
  if (!state.listing) apply(event, true);
  else if (state.listing.events.length < MAX_QUEUED) state.listing.events.push(event);
  else start(); // listing takes too long for what is waiting: from the start, from now
}

// Lists what is held (every page), then applies the events that came meanwhile; a failed
// list is retried (the events keep coming and wait for it). A list started later (a fresh
// stream after a 410, while this one still retries) supersedes this one: its events and its
// snapshot are newer, so this one ends without touching anything.
async function list(generation) {
  const mine = { events: [] };
  state.listing = mine;
  const current = () => generation === state.generation && state.listing === mine;
  for (;;) {
    try {
      const listed = await listAll(generation);
      if (!current()) return;
      state.held = listed;
      break;
    } catch (e) {
      if (!current() || (e instanceof Refused && e.status === 401)) return;
      showProblem('Listing what is held failed (' + e.message + '); trying again.');
      await sleep(state.retryMs);
      if (!current()) return;
    }
  }
  showProblem('');
  state.listing = null;
  for (const event of mine.events) apply(event, true);
  for (const name of state.held.keys()) state.toRead.add(name);
  render();
  if (state.refreshing !== generation) {
    state.refreshing = generation;
    refresh(generation);
  }
}

async function listAll(generation) {
  const listed = new Map();
  let cursor = null;
  do {
    let path = '/v1/leases?limit=1000&prefix=' + encodeURIComponent(state.prefix);
    if (cursor) path += '&cursor=' + encodeURIComponent(cursor);
    const page = await getJson(path, state.controller.signal);
    // A listed grant's time left is not known (the list gives its TTL): read below.
    for (const l of page.leases || []) listed.set(l.resource, entry(l, null));
    cursor = page.next_cursor || null;
  } while (cursor && generation === state.generation);
  return listed;
}

function entry(lease, sent) {
  return {
    holder: String(lease.holder),
    session: lease.session ? String(lease.session) : '',
    token: String(lease.token),
    ttlMs: Number(lease.ttl_seconds) * 1000,
    deadline: sent === null ? null : sent + Number(lease.expires_in_ms),
    row: null,
  };
}

function tokenNumber(t) {
  try {
    return BigInt(t);
  } catch (_) {
    return -1n;
  }
}

// Applies one ownership event to the held set, the timeline and the resource's history. Events
// come in etcd's order; a token is the grant's create revision, so an older grant's event never
// replaces a newer one's.
function apply(event, shown) {
  const resource = event.resource;
  const token = String(event.token);
  const current = state.held.get(resource);
  const history = state.history.get(resource) || [];
  let kind = event.type;
  if (kind === 'acquired') {
    const previous = history[0];
    if (previous && previous.ended === 'expired' && previous.holder !== event.holder) kind = 'taken-over';
    if (!current || tokenNumber(token) > tokenNumber(current.token)) {
      const held = {
        holder: String(event.holder),
        session: event.session ? String(event.session) : '',
        token,
        ttlMs: current && current.token === token ? current.ttlMs : 0,
        deadline: current && current.token === token ? current.deadline : null,
        row: null,
      };
      state.held.set(resource, held);
      state.toRead.add(resource);
    }
    if (!history.some((h) => h.token === token)) {
      history.unshift({ token, holder: String(event.holder), ended: null });
    }
  } else if (kind === 'released' || kind === 'expired') {
    if (current && current.token === token) state.held.delete(resource);
    const grant = history.find((h) => h.token === token);
    if (grant) grant.ended = kind;
    else history.unshift({ token, holder: String(event.holder), ended: kind });
  } else {
    return;
  }
  history.length = Math.min(history.length, MAX_HISTORY);
  state.history.set(resource, history);
  if (shown) timeline(kind, event);
  render();
  if (state.selected === resource) renderHistory();
}

// --- time left ----------------------------------------------------------------------------

async function readOne(resource, generation) {
  const sent = performance.now();
  try {
    const lease = await getJson('/v1/leases/' + encodeURIComponent(resource), state.controller.signal);
    const held = state.held.get(resource);
    if (generation !== state.generation || !held || held.token !== String(lease.token)) return;
    const fresh = entry(lease, sent);
    held.ttlMs = fresh.ttlMs;
    held.deadline = fresh.deadline;
    held.session = fresh.session;
  } catch (_) {
    // A 404 is the end of the grant: its event removes the row.
  }
}

// Re-reads time left: new grants first, then the held rows round robin, at most
// MAX_REFRESHED a second, 8 at a time.
async function refresh(generation) {
  while (generation === state.generation) {
    const started = performance.now();
    const batch = [...state.toRead].filter((r) => state.held.has(r)).slice(0, MAX_REFRESHED);
    state.toRead.clear();
    const names = [...state.held.keys()].sort();
    while (batch.length < Math.min(MAX_REFRESHED, names.length)) {
      state.cursor %= names.length;
      const next = names[state.cursor++];
      if (batch.includes(next)) break;
      batch.push(next);
    }
    for (let i = 0; i < batch.length; i += 8) {
      await Promise.all(batch.slice(i, i + 8).map((r) => readOne(r, generation)));
      if (generation !== state.generation) return;
      if (state.toRead.size && i + 8 >= batch.length) break; // new grants: read them next
    }
    if (!state.toRead.size) await sleep(Math.max(0, REFRESH_MS - (performance.now() - started)));
    else await sleep(50);
  }
}

let lastTick = 0;

function tick(now) {
  requestAnimationFrame(tick);
  if (now - lastTick < 100) return; // ten times a second is enough for a countdown
  lastTick = now;
  for (const held of state.held.values()) {
    if (!held.row || held.deadline === null) continue;
    // Capped at the TTL, text and bar alike: an answer may count more than the TTL (a lease
    // counted from after the request arrived, etcd's whole seconds), never a longer hold.
    const left = Math.min(Math.max(0, held.deadline - now), held.ttlMs > 0 ? held.ttlMs : Infinity);
    const bar = held.row.bar;
    bar.max = Math.max(held.ttlMs, 1);
    bar.value = Math.min(left, bar.max);
    bar.classList.toggle('low', left < held.ttlMs / 4);
    const text = left > 0 ? (left / 1000).toFixed(1) + ' s' : 'due';
    if (held.row.left.textContent !== text) held.row.left.textContent = text;
  }
  fleetTick(now);
}

// --- rendering ----------------------------------------------------------------------------

function cell(text, className) {
  const td = document.createElement('td');
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

// Renders the held table once per frame, however many events arrived in it.
function render() {
  if (state.renderQueued) return;
  state.renderQueued = true;
  requestAnimationFrame(() => {
    state.renderQueued = false;
    renderHeld();
  });
}

function renderHeld() {
  const body = $('held').tBodies[0];
  const names = [...state.held.keys()].sort();
  $('held-count').textContent = String(names.length);
  $('held-empty').hidden = names.length > 0;
  const rows = [];
  for (const name of names) {
    const held = state.held.get(name);
    if (!held.row) held.row = makeRow(name, held);
    rows.push(held.row.tr);
  }
  body.replaceChildren(...rows);
}

function makeRow(name, held) {
  const tr = document.createElement('tr');
  tr.dataset.resource = name;
  const first = document.createElement('td');
  const open = document.createElement('button');
  open.type = 'button';
  open.className = 'link';
  open.textContent = name;
  open.setAttribute('aria-label', 'Tokens of ' + name);
  open.addEventListener('click', () => select(name));
  first.appendChild(open);
  const bar = document.createElement('progress');
  bar.setAttribute('aria-label', 'Time left for ' + name);
  bar.max = 1;
  bar.value = 0;
  const left = document.createElement('span');
  left.className = 'left';
  left.textContent = '…';
  const time = document.createElement('td');
  time.append(bar, ' ', left);
  tr.append(first, cell(held.holder), cell(held.session || '—'), cell(held.token, 'num'), time);
  return { tr, bar, left };
}

function clock() {
  const t = document.createElement('time');
  const now = new Date();
  t.dateTime = now.toISOString();
  t.textContent = now.toLocaleTimeString();
  return t;
}

const LABELS = {
  acquired: 'acquired',
  released: 'released',
  expired: 'expired',
  'taken-over': 'taken over',
  resync: 'resynced',
};

function timeline(kind, event) {
  const li = document.createElement('li');
  li.className = 'event ' + kind;
  const label = document.createElement('span');
  label.className = 'kind ' + kind;
  label.textContent = LABELS[kind] || kind;
  const what = document.createElement('span');
  what.textContent = event.resource;
  const who = document.createElement('span');
  who.textContent = 'by ' + event.holder + ' · token ' + event.token;
  li.append(clock(), label, what, who);
  li.dataset.resource = event.resource;
  li.dataset.token = String(event.token);
  const list = $('timeline');
  list.prepend(li);
  while (list.children.length > MAX_EVENTS) list.lastElementChild.remove();
  $('timeline-empty').hidden = true;
}

function note(kind, text) {
  timeline(kind, { resource: '', holder: '', token: '' });
  $('timeline').firstElementChild.lastElementChild.textContent = text;
}

function select(resource) {
  state.selected = resource;
  renderHistory();
  $('history').hidden = false;
}

function renderHistory() {
  $('history-resource').textContent = state.selected;
  const items = (state.history.get(state.selected) || []).map((h) => {
    const li = document.createElement('li');
    const label = document.createElement('span');
    label.className = 'kind ' + (h.ended || 'acquired');
    label.textContent = h.ended ? h.ended : 'held';
    const who = document.createElement('span');
    who.textContent = 'token ' + h.token + ' · ' + h.holder;
    li.append(label, who);
    return li;
  });
  $('history-list').replaceChildren(...items);
}

// --- the enforcer (fence-gateway's feed, relayed by the proxy with --ui-gateway) -----------

const LABELS_REFUSED = {
  stale: 'stale',
  forged: 'forged',
  misdirected: 'misdirected',
  malformed: 'malformed',
};

// Polls the proxy's relay of the enforcer's feed (only what this caller may read).
async function enforcer() {
  $('enforcer').hidden = false;
  let last = 0;
  let marks = [];
  let process = null;
  let token = bearer();
  for (;;) {
    if (bearer() !== token) {
      // Another principal: what the last one saw goes.
      token = bearer();
      last = 0;
      process = null;
      marks = [];
      $('refusals').replaceChildren();
    }
    try {
      const resp = await fetch('/ui/enforcer?after=' + last, { headers: headers(), cache: 'no-store' });
      if (bearer() !== token) continue; // asked with the last principal's token: dropped
      if (resp.status === 401) {
        setPill('enforcer-state', 'bad', 'signed out');
        marks = [];
      } else if (!resp.ok) {
        const problem = await problemOf(resp);
        throw new Error((problem && problem.detail) || 'HTTP ' + resp.status);
      } else {
        const feed = await resp.json();
        if (bearer() !== token) continue;
        if (feed.process !== process) {
          // Another gateway process (a restart): its refusals are numbered from 1 again.
          const first = process === null;
          process = feed.process;
          if (!first || last !== 0) {
            last = 0;
            $('refusals').replaceChildren();
            continue;
          }
        }
        const received = Date.now();
        // Oldest first, so the newest ends on top.
        for (const r of (feed.refusals || []).slice().reverse()) {
          if (typeof r.seq === 'number' && r.seq > last) refusal(r, received);
        }
        if (typeof feed.last === 'number') last = Math.max(last, feed.last);
        marks = Array.isArray(feed.marks) ? feed.marks : [];
        setPill('enforcer-state', 'ok', 'live');
      }
    } catch (e) {
      setPill('enforcer-state', 'bad', 'unreachable: ' + e.message);
    }
    renderMarks(marks);
    await sleep(REFRESH_MS);
  }
}

function refusal(r, received) {
  const li = document.createElement('li');
  li.className = 'refusal';
  li.dataset.resource = String(r.resource);
  li.dataset.reason = String(r.reason);
  const t = document.createElement('time');
  // A duration the gateway measured, shown at this browser's time.
  const at = new Date(received - Math.max(0, Number(r.age_ms) || 0));
  t.dateTime = at.toISOString();
  t.textContent = at.toLocaleTimeString();
  const label = document.createElement('span');
  label.className = 'kind ' + (LABELS_REFUSED[r.reason] ? r.reason : 'malformed');
  label.textContent = LABELS_REFUSED[r.reason] || 'refused';
  const what = document.createElement('span');
  what.textContent = String(r.resource);
  const why = document.createElement('span');
  why.textContent = r.token ? 'token ' + r.token + ' below mark ' + r.mark : 'token not accepted';
  li.append(t, label, what, why);
  li.hidden = !String(r.resource).startsWith(state.prefix);
  fleetRefusal(String(r.resource), performance.now() - Math.max(0, Number(r.age_ms) || 0));
  const list = $('refusals');
  list.prepend(li);
  while (list.children.length > MAX_EVENTS) list.lastElementChild.remove();
  renderRefusals();
}

function renderRefusals() {
  let shown = 0;
  for (const li of $('refusals').children) {
    li.hidden = !li.dataset.resource.startsWith(state.prefix);
    if (!li.hidden) shown++;
  }
  $('refusals-empty').hidden = shown > 0;
}

function renderMarks(marks) {
  const rows = marks
    .filter((m) => typeof m.resource === 'string' && m.resource.startsWith(state.prefix))
    .slice(0, 50)
    .map((m) => {
      const tr = document.createElement('tr');
      tr.dataset.resource = m.resource;
      tr.append(cell(m.resource), cell(String(m.mark), 'num'));
      return tr;
    });
  $('marks').tBodies[0].replaceChildren(...rows);
}

async function configure() {
  try {
    const resp = await fetch('/ui/config.json', { cache: 'no-store' });
    const config = await resp.json();
    if (config.enforcer === true) enforcer();
  } catch (_) {
    // No configuration: no enforcer panel.
  }
}

// --- readiness ----------------------------------------------------------------------------

async function readiness() {
  for (;;) {
    try {
      const resp = await fetch('/readyz', { cache: 'no-store' });
      if (resp.ok) setPill('ready', 'ok', 'ready · etcd answers');
      else {
        const problem = await problemOf(resp);
        setPill('ready', 'bad', 'not ready' + (problem && problem.detail ? ': ' + problem.detail : ''));
      }
    } catch (_) {
      setPill('ready', 'bad', 'unreachable');
    }
    await sleep(READY_MS);
  }
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// --- wiring -------------------------------------------------------------------------------

document.addEventListener('DOMContentLoaded', () => {
  const params = new URLSearchParams(location.search);
  state.prefix = params.get('prefix') || '';
  $('prefix').value = state.prefix;
  $('filter').addEventListener('submit', (e) => {
    e.preventDefault();
    state.prefix = $('prefix').value;
    const url = new URL(location.href);
    if (state.prefix) url.searchParams.set('prefix', state.prefix);
    else url.searchParams.delete('prefix');
    history.replaceState(null, '', url);
    start();
  });
  $('fleet-name').value = params.get('fleet') || '';
  $('fleet-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const name = $('fleet-name').value.trim();
    const url = new URL(location.href);
    if (name) url.searchParams.set('fleet', name);
    else url.searchParams.delete('fleet');
    history.replaceState(null, '', url);
    showFleet(name);
  });
  lanesPointer();
  $('auth-form').addEventListener('submit', (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $('token').value.trim());
    $('token').value = '';
    $('auth').hidden = true;
    forget();
    start();
  });
  $('sign-out').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    forget();
    start();
  });
  readiness();
  configure();
  requestAnimationFrame(tick);
  showFleet(params.get('fleet') || '');
  start();
});
