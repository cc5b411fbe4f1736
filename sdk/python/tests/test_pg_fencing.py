"""Fencing inside PostgreSQL (docs/POSTGRES.md) from a Python driver: psycopg, several
connections at once, against a scratch database with the package installed by the real
``fence-gateway pg install`` (``$FENCE_GATEWAY_BIN``) and the key file loaded by ``pg sync-keys``.

Tokens are minted here, by a second implementation of the wire form (fencing/src/keys/mod.rs),
so the SQL verification is checked against the format, not only against the Rust code. The
concurrent cases the psql script cannot show: a new holder's admit waits for an old holder's
open transaction, which commits first or is refused; a killed session changes nothing; READ
COMMITTED and SERIALIZABLE; a gateway's lower-token write in flight holds a raise back."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Tuple
from urllib.parse import urlsplit

import pytest

psycopg = pytest.importorskip("psycopg")
from psycopg import errors  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
ADMIN_URL = os.environ.get(
    "FENCING_TEST_POSTGRES", "postgres://lease_proxy:lease_proxy@127.0.0.1:5432/lease_proxy_test"
)


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@dataclass
class Key:
    kid: str
    secret: bytes

    def line(self) -> str:
        return f"{self.kid} {b64url(self.secret)}\n"

    def mint(self, resource: str, era: int, revision: int) -> str:
        """The wire token `v1.{kid}.{era}.{revision}.{tag}.{mac}` of fencing::Keyring::mint."""
        tag = hmac.new(
            self.secret, b"lease-proxy/fencing/resource/v1\0" + resource.encode(), hashlib.sha256
        ).digest()[:16]
        signed = (
            b"lease-proxy/fencing/token/v1\0"
            + self.kid.encode()
            + b"\0"
            + era.to_bytes(8, "big")
            + revision.to_bytes(8, "big")
            + tag
        )
        mac = hmac.new(self.secret, signed, hashlib.sha256).digest()
        return f"v1.{self.kid}.{era}.{revision}.{b64url(tag)}.{b64url(mac)}"


@dataclass
class Package:
    """A scratch database with the package installed: ``app`` writes, ``gw`` is a gateway."""

    admin_url: str
    url_of: dict
    roles: dict
    key: Key

    def connect(self, role: str = "app", **kwargs) -> "psycopg.Connection":
        return psycopg.connect(self.url_of[role], **kwargs)

    def mark(self, resource: str) -> Optional[str]:
        with self.connect(autocommit=True) as c:
            return c.execute("SELECT fencing.mark(%s)", [resource]).fetchone()[0]


def gateway_bin() -> str:
    return os.environ.get("FENCE_GATEWAY_BIN") or str(ROOT / "target" / "debug" / "fence-gateway")


def run_gateway(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([gateway_bin(), *args], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def package() -> Iterator[Package]:
    parts = urlsplit(ADMIN_URL)
    password = parts.password or ""
    name = f"indb_py_{uuid.uuid4().hex[:12]}"
    roles = {r: f"{name}_{r}" for r in ("owner", "app", "gw")}
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
        admin.execute(f"CREATE ROLE {roles['owner']} NOLOGIN")
        admin.execute(f"GRANT {roles['owner']} TO CURRENT_USER")
        for role in ("app", "gw"):
            admin.execute(f"CREATE ROLE {roles[role]} LOGIN PASSWORD '{password}'")

    def url(user: str) -> str:
        return f"postgres://{user}:{password}@{parts.hostname}:{parts.port or 5432}/{name}"

    installer_url = url(parts.username or "lease_proxy")
    key = Key("k1", secrets.token_bytes(32))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            key_file = Path(tmp) / "keys"
            key_file.write_text("# test key\n" + key.line())
            done = run_gateway(
                "pg", "install", "--database-url", installer_url, "--owner", roles["owner"],
                "--writer", roles["app"], "--gateway-role", roles["gw"],
            )
            assert done.returncode == 0, done.stdout + done.stderr
            done = run_gateway(
                "pg", "sync-keys", "--database-url", installer_url, "--key-file", str(key_file)
            )
            assert done.returncode == 0, done.stdout + done.stderr
        with psycopg.connect(installer_url, autocommit=True) as c:
            c.execute(
                "CREATE TABLE ledger (resource text, holder text, at timestamptz DEFAULT clock_timestamp())"
            )
            c.execute(f"GRANT SELECT, INSERT ON ledger TO {roles['app']}")
        yield Package(
            admin_url=installer_url,
            url_of={"app": url(roles["app"]), "gw": url(roles["gw"]), "installer": installer_url},
            roles=roles,
            key=key,
        )
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            # Membership lets DROP DATABASE … (FORCE) end sessions a failed test left open.
            admin.execute(f"GRANT {roles['app']}, {roles['gw']} TO CURRENT_USER")
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            admin.execute("DROP ROLE IF EXISTS " + ", ".join(roles.values()))


def resource() -> str:
    return f"r-{uuid.uuid4().hex[:10]}"


class Background:
    """Runs ``fn`` in a thread; ``result()`` waits for it and re-raises what it raised."""

    def __init__(self, fn) -> None:
        self.value = None
        self.error: Optional[BaseException] = None
        self.finished_at: Optional[float] = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn) -> None:
        try:
            self.value = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e
        self.finished_at = time.monotonic()

    def done(self) -> bool:
        return not self.thread.is_alive()

    def result(self, timeout: float = 30.0):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "still running"
        if self.error is not None:
            raise self.error
        return self.value


def test_tokens_minted_in_python_verify_and_refusals_are_classed(package: Package) -> None:
    r = resource()
    k = package.key
    with package.connect(autocommit=True) as c:
        assert c.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 5)]).fetchone()[0] == "0:5"
        assert c.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 7)]).fetchone()[0] == "0:7"
        # Stale: an IntegrityError (class 23) — an ORM does not retry it.
        with pytest.raises(errors.IntegrityError) as stale:
            c.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 6)])
        assert stale.value.sqlstate == "23F01"
        assert "below its mark 0:7" in str(stale.value)
        refusals = [
            (k.mint(r, 0, 9).replace(".9.", ".10.", 1), "28F03"),  # forged number
            (Key("k1", secrets.token_bytes(32)).mint(r, 0, 9), "28F03"),  # another secret
            (k.mint("elsewhere", 0, 9), "28F04"),  # misdirected
            (k.mint("lock/" + r.encode().hex(), 0, 9), "28F04"),  # another domain
            (Key("k2", secrets.token_bytes(32)).mint(r, 0, 9), "28F02"),  # unknown key
            ("v1.k1.0.9", "28F01"),
        ]
        for wire, code in refusals:
            with pytest.raises(errors.OperationalError) as refused:  # class 28
                c.execute("SELECT fencing.admit(%s, %s)", [r, wire])
            assert refused.value.sqlstate == code, (wire, str(refused.value))
    assert package.mark(r) == "0:7"


def test_a_new_holder_waits_for_the_old_holders_open_transaction(package: Package) -> None:
    r = resource()
    k = package.key
    with package.connect(autocommit=True) as c:
        c.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 5)])
    # At the mark: the old holder's transaction takes the mark row FOR SHARE.
    old = package.connect()
    old.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 5)])
    old.execute("INSERT INTO ledger (resource, holder) VALUES (%s, 'old')", [r])

    def new_holder() -> str:
        with package.connect() as new:
            token = new.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 6)]).fetchone()[0]
            new.execute("INSERT INTO ledger (resource, holder) VALUES (%s, 'new')", [r])
            new.commit()
            return token

    raising = Background(new_holder)
    time.sleep(0.5)
    assert not raising.done(), "the raise did not wait for the open transaction at the old mark"
    committed_at = time.monotonic()
    old.commit()
    assert raising.result() == "0:6"
    assert raising.finished_at is not None and raising.finished_at >= committed_at
    with package.connect() as c:
        order = [h for (h,) in c.execute("SELECT holder FROM ledger WHERE resource = %s ORDER BY at", [r])]
    assert order == ["old", "new"]
    # The old holder's next transaction is refused; nothing of it lands.
    with pytest.raises(errors.IntegrityError):
        old.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 5)])
    old.rollback()
    old.close()


def test_an_old_holder_behind_an_open_raise_is_refused_when_it_commits(package: Package) -> None:
    r = resource()
    k = package.key
    with package.connect(autocommit=True) as c:
        c.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 7)])
    new = package.connect()
    new.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 9)])

    def old_holder() -> None:
        with package.connect() as old:
            old.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 7)])
            old.execute("INSERT INTO ledger (resource, holder) VALUES (%s, 'old')", [r])
            old.commit()

    late = Background(old_holder)
    time.sleep(0.5)
    assert not late.done(), "the old holder was admitted past an open raise"
    new.commit()
    new.close()
    with pytest.raises(errors.IntegrityError) as stale:
        late.result()
    assert stale.value.sqlstate == "23F01"
    with package.connect() as c:
        assert c.execute("SELECT count(*) FROM ledger WHERE resource = %s", [r]).fetchone()[0] == 0


def test_concurrent_raises_end_at_the_highest_and_the_lower_is_refused(package: Package) -> None:
    r = resource()
    k = package.key
    with package.connect(autocommit=True) as c:
        c.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 5)])
    higher = package.connect()
    higher.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 9)])

    def lower_raise() -> None:
        with package.connect() as lower:
            lower.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 8)])
            lower.commit()

    late = Background(lower_raise)
    time.sleep(0.4)
    assert not late.done(), "a second raise did not wait for the first"
    higher.commit()
    higher.close()
    with pytest.raises(errors.IntegrityError):
        late.result()
    assert package.mark(r) == "0:9"


def test_a_session_killed_mid_transaction_changes_nothing(package: Package) -> None:
    r = resource()
    k = package.key
    with package.connect(autocommit=True) as c:
        c.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 3)])
    doomed = package.connect()
    pid = doomed.info.backend_pid
    doomed.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 11)])
    doomed.execute("INSERT INTO ledger (resource, holder) VALUES (%s, 'doomed')", [r])
    with package.connect(autocommit=True) as killer:
        assert killer.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
    with pytest.raises(psycopg.OperationalError):
        doomed.execute("SELECT 1")
    doomed.close()
    assert package.mark(r) == "0:3"
    with package.connect(autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM ledger WHERE resource = %s", [r]).fetchone()[0] == 0
        # The raise died with the session: a token between the two is still good.
        assert c.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 4)]).fetchone()[0] == "0:4"


def test_serializable_writers_admit_at_the_mark_and_raise_first(package: Package) -> None:
    r = resource()
    k = package.key
    with package.connect(autocommit=True) as c:
        c.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 2)])
    with package.connect() as s:
        s.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        # A raise inside SERIALIZABLE is refused: its snapshot cannot see every gateway write.
        with pytest.raises(errors.OperationalError) as refused:  # class 55
            s.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 5)])
        assert refused.value.sqlstate == "55F01"
        s.rollback()
        # Raised first in autocommit (READ COMMITTED), then admitted at the mark.
        with package.connect(autocommit=True) as c:
            c.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 5)])
        s.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 5)])
        s.execute("INSERT INTO ledger (resource, holder) VALUES (%s, 'serializable')", [r])
        s.commit()
        # A raise committed after a SERIALIZABLE transaction's snapshot: its admit is a
        # serialization failure, which it retries like any other.
        s.execute("SELECT 1")
        with package.connect(autocommit=True) as c:
            c.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 6)])
        with pytest.raises(errors.SerializationFailure):
            s.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 6)])
        s.rollback()
        s.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 6)])
        s.commit()


def test_a_raise_waits_for_a_gateways_lower_write_in_flight(package: Package) -> None:
    r = resource()
    k = package.key
    with package.connect(autocommit=True) as c:
        c.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 4)])
    gw = package.connect("gw", autocommit=True)
    # What a fence-gateway's SharedGate registers for a write it admitted (inflight.rs).
    lower = (0).to_bytes(8, "big") + (4).to_bytes(8, "big")
    gw.execute(
        "INSERT INTO fence_inflight VALUES (%s, %s, %s, clock_timestamp() + interval '1 minute')",
        [424242, r, lower],
    )

    def raise_it() -> str:
        with package.connect() as new:
            token = new.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 8)]).fetchone()[0]
            new.commit()
            return token

    raising = Background(raise_it)
    time.sleep(0.4)
    assert not raising.done(), "the raise did not wait for the gateway's write in flight"
    # Meanwhile a gateway cannot register another write at the old mark: the raise holds the row.
    gw.execute("SET lock_timeout = '100ms'")
    with pytest.raises(errors.LockNotAvailable):
        gw.execute("SELECT mark FROM fence_marks WHERE resource = %s FOR SHARE", [r])
    ended_at = time.monotonic()
    gw.execute("DELETE FROM fence_inflight WHERE id = 424242")  # the write's exchange ended
    assert raising.result() == "0:8"
    assert raising.finished_at is not None and raising.finished_at - ended_at < 2.0
    gw.close()


def test_trigger_mode_through_the_driver(package: Package) -> None:
    r = resource()
    k = package.key
    with psycopg.connect(package.url_of["installer"], autocommit=True) as owner:
        table = f"stock_{uuid.uuid4().hex[:8]}"
        owner.execute(f"CREATE TABLE {table} (aisle text PRIMARY KEY, count int)")
        owner.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {package.roles['app']}")
        owner.execute("SELECT fencing.protect(%s, 'aisle')", [table])
    with package.connect() as c:
        c.execute("SELECT set_config('fencing.token', %s, true)", [k.mint(r, 0, 3)])
        c.execute(f"INSERT INTO {table} VALUES (%s, 1)", [r])
        c.commit()
        # No token in the next transaction: the setting was transaction-local.
        with pytest.raises(errors.OperationalError) as missing:
            c.execute(f"UPDATE {table} SET count = 2 WHERE aisle = %s", [r])
        assert missing.value.sqlstate == "28F05"
        c.rollback()
        with package.connect(autocommit=True) as other:
            other.execute("SELECT fencing.admit(%s, %s)", [r, k.mint(r, 0, 4)])
        c.execute("SELECT set_config('fencing.token', %s, true)", [k.mint(r, 0, 3)])
        with pytest.raises(errors.IntegrityError):
            c.execute(f"UPDATE {table} SET count = 2 WHERE aisle = %s", [r])
        c.rollback()
        assert c.execute(f"SELECT count FROM {table} WHERE aisle = %s", [r]).fetchone()[0] == 1


class Held:
    """What the SDK's ``admit`` reads of a lease, for a token minted here."""

    def __init__(self, resource: str, token: str) -> None:
        self.resource = resource
        self.fencing_token = token
        self.lost = threading.Event()
        self.lost_reason: Optional[str] = None


def test_the_sdks_admit_runs_in_the_callers_transaction(package: Package) -> None:
    from lease_proxy_client import Lost, admit

    r = resource()
    old, new = Held(r, package.key.mint(r, 0, 10)), Held(r, package.key.mint(r, 0, 20))
    with package.connect() as c:  # one transaction: the write commits with the admit
        assert admit(c, old) == "0:10"
        c.execute("INSERT INTO ledger (resource, holder) VALUES (%s, 'old')", [r])
    with package.connect() as c, c.cursor() as cursor:
        assert admit(cursor, new) == "0:20"
        cursor.execute("INSERT INTO ledger (resource, holder) VALUES (%s, 'new')", [r])
    with package.connect() as c:
        with pytest.raises(errors.IntegrityError) as stale:
            admit(c, old)
        assert stale.value.sqlstate == "23F01"
    new.lost.set()
    with package.connect() as c:
        with pytest.raises(Lost):
            admit(c, new)
    assert package.mark(r) == "0:20"
    with package.connect(autocommit=True) as c:
        rows = c.execute("SELECT holder FROM ledger WHERE resource = %s ORDER BY at", [r]).fetchall()
    assert [h for (h,) in rows] == ["old", "new"]
