"""The end of a command's stdin is never sent after the channel's close (paramiko issues 1115 and 1705).

A command that ends while gpuk8s sends its EOF has its close answered by paramiko's own thread; were the EOF
sent after that CLOSE, OpenSSH's sshd would drop the whole connection ("ieof packet referred to nonexistent
channel"). The interleaving is forced here: the server's close arrives exactly while the EOF is being sent.
"""
from __future__ import annotations

import threading

import paramiko
from paramiko.common import cMSG_CHANNEL_CLOSE, cMSG_CHANNEL_EOF

from gpuk8s.remote import send_eof


class _Transport:
    """What a channel and send_eof call on a transport; the first message sent lets the server's close in
    meanwhile (paramiko's transport thread handling it)."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.chan: paramiko.Channel | None = None
        self.closer: threading.Thread | None = None
        self.active = True
        self.clear_to_send = threading.Event()
        self.clear_to_send.set()  # no key exchange under way
        self.clear_to_send_lock = threading.Lock()

    def get_log_channel(self) -> str:
        return "paramiko.transport"

    def _unlink_channel(self, chanid: int) -> None:
        pass

    def _close_arrives(self) -> None:
        if self.closer is None:  # the server's CLOSE, handled by paramiko's thread, arrives right now
            assert self.chan is not None
            self.closer = threading.Thread(target=self.chan._handle_close, args=(paramiko.Message(),))
            self.closer.start()
            self.closer.join(0.3)  # it sends its answer at once unless a lock holds it back

    def _send_message(self, m: paramiko.Message) -> None:
        self._close_arrives()
        self.sent.append(m.asbytes()[:1])

    def _send_user_message(self, m: paramiko.Message) -> None:
        self._close_arrives()  # paramiko's: a message built under the channel's lock, sent after it
        with self.clear_to_send_lock:  # as paramiko's: under the transport's send lock, never the channel's
            self._send_message(m)


def _channel() -> tuple[paramiko.Channel, _Transport]:
    t = _Transport()
    chan = paramiko.Channel(0)
    chan._set_transport(t)  # type: ignore[arg-type]
    chan.active = True
    chan.remote_chanid = 7
    t.chan = chan
    return chan, t


def test_the_eof_goes_before_a_close_that_arrives_while_it_is_sent() -> None:
    chan, t = _channel()
    send_eof(chan)
    assert t.closer is not None
    t.closer.join(5)
    assert t.sent == [cMSG_CHANNEL_EOF, cMSG_CHANNEL_CLOSE]


def test_the_harness_forces_the_race_on_an_eof_sent_outside_the_lock() -> None:
    """What paramiko 5.1's shutdown_write() does (build under the lock, send after it): the CLOSE goes first.
    Without this, the test above could pass on a harness that never interleaves."""
    chan, t = _channel()
    with chan.lock:
        m = chan._send_eof()
    assert m is not None
    t._send_user_message(m)
    assert t.closer is not None
    t.closer.join(5)
    assert t.sent == [cMSG_CHANNEL_CLOSE, cMSG_CHANNEL_EOF]


def test_no_eof_on_a_closed_channel() -> None:
    chan, t = _channel()
    t.closer = threading.Thread()  # no close arrives during this send
    chan._handle_close(paramiko.Message())
    sent = list(t.sent)
    send_eof(chan)
    assert t.sent == sent == [cMSG_CHANNEL_EOF, cMSG_CHANNEL_CLOSE]  # paramiko's own EOF, its CLOSE, nothing more


def test_the_eof_waits_for_a_key_exchange_without_holding_the_channel() -> None:
    """During a key exchange (clear_to_send cleared) nothing is sent and the channel's lock stays free (paramiko's
    thread takes it for a window adjust meanwhile); the EOF goes once the exchange is over."""
    chan, t = _channel()
    t.closer = threading.Thread()  # no close arrives in this test
    t.clear_to_send.clear()
    sender = threading.Thread(target=send_eof, args=(chan,))
    sender.start()
    sender.join(0.3)
    assert sender.is_alive() and t.sent == []
    assert chan.lock.acquire(timeout=1)  # free: a window adjust would not wait
    chan.lock.release()
    t.clear_to_send.set()
    sender.join(5)
    assert not sender.is_alive() and t.sent == [cMSG_CHANNEL_EOF]
