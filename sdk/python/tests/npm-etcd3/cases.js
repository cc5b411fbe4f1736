// The unmodified npm `etcd3` client (its version pinned by package-lock.json beside this file),
// run through a fixed sequence of cases against one endpoint, in one process:
//
//   node cases.js http://127.0.0.1:PORT
//
// prints one JSON line per case, {"case": name, "out": ...} or {"case": name, "error": {...}},
// then {"done": true}. ../test_etcd_clients.py runs it once against lease-proxy and once
// against etcd and compares the lines once revisions, lease ids and times are normalised; the
// values printed here are the client's own (int64 fields stay the strings it gives).
//
// Every key is under `npm/` or `election/npm-` (the client's own election prefix): the etcd
// side writes them at etcd's root, the proxy side inside the proxy's namespace, so a namespace
// leak would touch the other side's keys (the test checks it does not).
'use strict';

const { Etcd3, EtcdLockFailedError } = require('etcd3');

const endpoint = process.argv[2];
if (!endpoint) {
  console.error('usage: node cases.js http://HOST:PORT');
  process.exit(2);
}

const CASE_TIMEOUT_MS = 15000;
const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

// A key-value as the lines compare it (the test normalises the revisions and the lease id).
const kv = k =>
  k && {
    key: k.key.toString(),
    value: k.value.toString(),
    version: k.version,
    create_revision: k.create_revision,
    mod_revision: k.mod_revision,
    lease: k.lease,
  };

// Resolves with the first `event` emitted by `emitter` that `accept` takes, or rejects after
// `ms` (then the case fails as a timeout, not a hang).
function next(emitter, event, ms = 8000, accept = () => true) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      emitter.removeListener(event, on);
      reject(new Error(`timeout waiting for ${event}`));
    }, ms);
    function on(...args) {
      if (!accept(...args)) return;
      clearTimeout(timer);
      emitter.removeListener(event, on);
      resolve(args);
    }
    emitter.on(event, on);
  });
}

function errorOf(e) {
  return { name: e.constructor.name, message: String(e.message) };
}

const cases = [];
const define = (name, fn) => cases.push([name, fn]);

// put / get / getAll with a prefix, sort, count, keys / delete with the previous values.
define('kv', async c => {
  const out = {};
  out.put = await c.put('npm/kv/a').value('1').exec().then(r => ({ prev: kv(r.prev_kv) }));
  await c.put('npm/kv/b').value('2');
  await c.put('npm/kv/c').value('3');
  out.overwrite_prev = kv(await c.put('npm/kv/a').value('1b').getPrevious());
  out.get_string = await c.get('npm/kv/a').string();
  out.get_missing = await c.get('npm/kv/zz').string();
  out.get_exec = (await c.get('npm/kv/a').exec()).kvs.map(kv);
  out.all_strings = await c.getAll().prefix('npm/kv/').strings();
  out.all_desc_keys = await c.getAll().prefix('npm/kv/').sort('Key', 'Descend').keys();
  out.all_by_mod_limit = await c.getAll().prefix('npm/kv/').sort('Mod', 'Ascend').limit(2).keys();
  out.count = await c.getAll().prefix('npm/kv/').count();
  out.exists = await c.get('npm/kv/b').exists();
  out.delete_one_prev = (await c.delete().key('npm/kv/a').getPrevious()).map(kv);
  const d = await c.delete().prefix('npm/kv/').exec();
  out.delete_prefix = { deleted: d.deleted };
  out.after = await c.getAll().prefix('npm/kv/').keys();
  return out;
});

// if(...).then(...).else(...) transactions, every compare target, range ops inside.
define('txn', async c => {
  const out = {};
  await c.delete().prefix('npm/txn/');
  await c.put('npm/txn/k').value('x');
  const sides = r => ({
    succeeded: r.succeeded,
    responses: r.responses.map(x =>
      x.response_range
        ? { range: x.response_range.kvs.map(kv) }
        : x.response_put
        ? { put: { prev: kv(x.response_put.prev_kv) } }
        : x.response_delete_range
        ? { delete: x.response_delete_range.deleted }
        : { other: x.response }
    ),
  });
  out.value_eq = sides(
    await c
      .if('npm/txn/k', 'Value', '==', 'x')
      .then(c.put('npm/txn/k').value('y'), c.get('npm/txn/k'))
      .else(c.put('npm/txn/k').value('z'))
      .commit()
  );
  out.value_eq_again = sides(
    await c
      .if('npm/txn/k', 'Value', '==', 'x')
      .then(c.put('npm/txn/k').value('y'))
      .else(c.get('npm/txn/k'), c.put('npm/txn/other').value('o'))
      .commit()
  );
  const cur = (await c.get('npm/txn/k').exec()).kvs[0];
  out.version_mod_create = sides(
    await c
      .if('npm/txn/k', 'Version', '>', 1)
      .and('npm/txn/k', 'Mod', '==', cur.mod_revision)
      .and('npm/txn/k', 'Create', '<', cur.mod_revision)
      .and('npm/txn/none', 'Create', '==', 0)
      .then(c.delete().key('npm/txn/other'), c.getAll().prefix('npm/txn/').sort('Key', 'Ascend'))
      .commit()
  );
  out.failing_lease_compare = sides(
    await c
      .if('npm/txn/k', 'Lease', '!=', 0)
      .then(c.put('npm/txn/never').value('1'))
      .else(c.getAll().prefix('npm/txn/').sort('Key', 'Descend'))
      .commit()
  );
  await c.delete().prefix('npm/txn/');
  return out;
});

// client.lease(ttl): the grant's TTL (LeaseTimeToLive), the automatic keepalive stream and its
// `keepaliveSucceeded` events, keepaliveOnce, keys on the lease, revoke; a lease revoked
// elsewhere is reported `lost` by the keepalive (etcd answers TTL 0).
define('lease', async c => {
  const out = {};
  const lease = c.lease(3);
  const events = [];
  lease.on('keepaliveEstablished', () => events.push('established'));
  const firstTwo = new Promise((resolve, reject) => {
    const got = [];
    const timer = setTimeout(() => reject(new Error('no two keepaliveSucceeded')), 8000);
    lease.on('keepaliveSucceeded', res => {
      got.push({ ID: res.ID, TTL: res.TTL });
      if (got.length === 2) {
        clearTimeout(timer);
        resolve(got);
      }
    });
  });
  const id = await lease.grant();
  out.id = id;
  await lease.put('npm/lease/k').value('on-lease');
  out.keepalives = await firstTwo;
  out.events = events;
  const ttl = await c.leaseClient.leaseTimeToLive({ ID: id, keys: true });
  out.time_to_live = {
    ID: ttl.ID,
    grantedTTL: ttl.grantedTTL,
    ttl_in_range: Number(ttl.TTL) > 0 && Number(ttl.TTL) <= 3,
    keys: ttl.keys.map(k => k.toString()),
  };
  const once = await lease.keepaliveOnce();
  out.keepalive_once = { ID: once.ID, TTL: once.TTL };
  out.key_on_lease = kv((await c.get('npm/lease/k').exec()).kvs[0]);
  await lease.revoke();
  out.revoked = lease.revoked();
  out.key_after_revoke = await c.get('npm/lease/k').string();
  const gone = await c.leaseClient.leaseTimeToLive({ ID: id });
  out.time_to_live_after_revoke = { ID: gone.ID, TTL: gone.TTL, grantedTTL: gone.grantedTTL };
  out.revoke_again = await c.leaseClient.leaseRevoke({ ID: id }).then(
    () => 'ok',
    e => errorOf(e)
  );
  out.put_on_revoked = await c
    .put('npm/lease/k2')
    .value('x')
    .lease(id)
    .exec()
    .then(
      () => 'ok',
      e => errorOf(e)
    );

  // Revoked by someone else while its keepalive runs: the next keepalive answer is TTL 0.
  const lost = c.lease(3);
  const lostId = await lost.grant();
  const lostEvent = next(lost, 'lost', 8000);
  await c.leaseClient.leaseRevoke({ ID: lostId });
  const [err] = await lostEvent;
  out.lost = { name: err.constructor.name, revoked: lost.revoked(), same_id: err.message.includes(lostId) };
  return out;
});

// client.lock(key): acquire, a contended acquire is a try-lock (EtcdLockFailedError), release
// revokes the lease, then the other takes it.
define('lock', async c => {
  const out = {};
  const first = c.lock('npm/lock/a').ttl(5);
  await first.acquire();
  const held = (await c.get('npm/lock/a').exec()).kvs.map(kv);
  out.held = held;
  out.first_lease_is_key_lease = held[0].lease === (await first.leaseId());
  const second = c.lock('npm/lock/a').ttl(5);
  out.contended = await second.acquire().then(
    () => 'acquired',
    e => ({ name: e.constructor.name, is_lock_failed: e instanceof EtcdLockFailedError, message: e.message })
  );
  await first.release();
  out.after_release = await c.get('npm/lock/a').string();
  const third = c.lock('npm/lock/a').ttl(5);
  await third.acquire();
  out.third = (await c.get('npm/lock/a').exec()).kvs.map(kv);
  out.do_result = await c
    .lock('npm/lock/b')
    .ttl(5)
    .do(async () => (await c.get('npm/lock/b').exists()) && 'ran');
  out.b_after_do = await c.get('npm/lock/b').exists();
  await third.release();
  out.a_after = await c.get('npm/lock/a').exists();
  return out;
});

// client.election(name): campaign, leader, observe (changes), a second campaign waits until
// the first resigns, proclaim, resign.
define('election', async c => {
  const out = {};
  const election = c.election('npm-el', 5);
  out.leader_before = (await election.leader()) ?? null;
  const alice = election.campaign('alice');
  await alice.wait();
  out.leader_alice = await election.leader();
  const observer = await election.observe();
  const changes = [];
  observer.on('change', v => changes.push(v === undefined ? null : v));
  out.observer_leader = observer.leader();
  const bob = election.campaign('bob');
  let bobElected = false;
  const bobWait = bob.wait().then(() => (bobElected = true));
  await sleep(500);
  out.bob_elected_while_alice_leads = bobElected;
  const sawProclaim = next(observer, 'change', 8000, v => v === 'alice-2');
  await alice.proclaim('alice-2');
  await sawProclaim;
  out.leader_after_proclaim = await election.leader();
  const sawBob = next(observer, 'change', 8000, v => v === 'bob');
  await alice.resign();
  await bobWait;
  out.bob_elected_after_resign = bobElected;
  await sawBob;
  out.leader_bob = await election.leader();
  const keys = await c.getAll().prefix('election/npm-el/').keys();
  out.keys_under_election = keys.length;
  out.key_is_lease = keys.every(k => /^election\/npm-el\/[0-9]+$/.test(k));
  const sawNone = next(observer, 'change', 8000, v => v === undefined);
  await bob.resign();
  await sawNone;
  out.leader_after_all_resign = (await election.leader()) ?? null;
  // With no leader the observer watches the election's prefix from the Range's revision.
  const sawCarol = next(observer, 'change', 8000, v => v === 'carol');
  const carol = election.campaign('carol');
  await carol.wait();
  await sawCarol;
  out.observer_leader_carol = observer.leader();
  await carol.resign();
  out.changes = changes;
  await observer.cancel();
  return out;
});

// The watch builder: a prefix watch with previous values, a key watch filtered to deletes
// (`only('delete')`, etcd's NOPUT), history from a start revision, progress notifications
// (the builder always asks for them; etcd here sends one a second), cancel.
define('watch', async c => {
  const out = {};
  const watcher = await c.watch().prefix('npm/watch/').withPreviousKV().create();
  const seen = [];
  const progress = [];
  watcher.on('data', res => {
    if (res.events.length === 0) progress.push(res.watch_id);
    for (const ev of res.events) seen.push({ type: ev.type, kv: kv(ev.kv), prev: kv(ev.prev_kv) ?? null });
  });
  const deletes = await c.watch().key('npm/watch/b').only('delete').create();
  const deleteSeen = [];
  deletes.on('data', res => {
    for (const ev of res.events) deleteSeen.push({ type: ev.type, key: ev.kv.key.toString() });
  });
  const first = await c.put('npm/watch/a').value('1');
  await c.put('npm/watch/b').value('2');
  await c.put('npm/watch/a').value('3');
  await c.delete().key('npm/watch/b');
  await c.put('npm/outside').value('not watched');
  for (let i = 0; i < 80 && (seen.length < 4 || deleteSeen.length < 1); i++) await sleep(50);
  out.events = seen;
  out.only_delete = deleteSeen;
  out.watch_ids = [watcher.id, deletes.id];

  // history from the first put's revision
  const history = await c.watch().prefix('npm/watch/').startRevision(first.header.revision).create();
  const replayed = [];
  history.on('data', res => {
    for (const ev of res.events) replayed.push(`${ev.type} ${ev.kv.key} ${ev.kv.value}`);
  });
  for (let i = 0; i < 80 && replayed.length < 4; i++) await sleep(50);
  out.history = replayed;
  out.history_watch_id = history.id;
  await history.cancel();

  // a progress notification arrives on an idle watch
  const before = progress.length;
  for (let i = 0; i < 100 && progress.length === before; i++) await sleep(50);
  out.progress_notified = progress.length > before;

  await deletes.cancel();
  await watcher.cancel();
  await c.put('npm/watch/a').value('after-cancel');
  await sleep(300);
  out.events_after_cancel = seen.length;
  await c.delete().prefix('npm/watch/');
  await c.delete().key('npm/outside');
  return out;
});

// Software transactional memory: reads at the snapshot's revision, a commit guarded by mod
// revisions, a conflicting write in the middle retried.
define('stm', async c => {
  const out = {};
  await c.put('npm/stm/a').value('1');
  await c.put('npm/stm/b').value('10');
  let tries = 0;
  out.result = await c.stm().transact(async tx => {
    tries += 1;
    const a = Number(await tx.get('npm/stm/a').string());
    const b = Number(await tx.get('npm/stm/b').string());
    if (tries === 1) await c.put('npm/stm/b').value('20'); // a conflicting write: retried
    await tx.put('npm/stm/a').value(String(a + b));
    return a + b;
  });
  out.tries = tries;
  out.after = await c.getAll().prefix('npm/stm/').strings();
  await c.delete().prefix('npm/stm/');
  return out;
});

// Errors the client maps by etcd's message text.
define('errors', async c => {
  const out = {};
  out.put_unknown_lease = await c
    .put('npm/err/k')
    .value('v')
    .lease('7587')
    .exec()
    .then(
      () => 'ok',
      e => errorOf(e)
    );
  out.revoke_unknown = await c.leaseClient.leaseRevoke({ ID: '7587' }).then(
    () => 'ok',
    e => errorOf(e)
  );
  out.empty_key = await c.kv.range({ key: Buffer.alloc(0) }).then(
    () => 'ok',
    e => errorOf(e)
  );
  return out;
});

async function main() {
  const client = new Etcd3({ hosts: endpoint, dialTimeout: 5000 });
  for (const [name, fn] of cases) {
    let line;
    try {
      let timer;
      const out = await Promise.race([
        fn(client),
        new Promise((_, reject) => {
          timer = setTimeout(() => reject(new Error(`case timed out after ${CASE_TIMEOUT_MS} ms`)), CASE_TIMEOUT_MS);
        }),
      ]).finally(() => clearTimeout(timer));
      line = { case: name, out };
    } catch (e) {
      line = { case: name, error: errorOf(e) };
    }
    process.stdout.write(JSON.stringify(line) + '\n');
  }
  client.close();
  process.stdout.write(JSON.stringify({ done: true }) + '\n');
  // A case that timed out may leave a stream open: do not wait for it.
  process.exit(0);
}

main().catch(e => {
  console.error(e);
  process.exit(1);
});
