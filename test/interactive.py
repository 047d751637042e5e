#!/usr/bin/env python3
"""interactive: ./translate answers each line as it is typed.

  1. at a terminal (a pseudo-terminal): a line typed gets its translation before the next line is sent;
     Ctrl-C at the prompt ends the session with exit status 0 and nothing after the last translation but
     the echoed ^C and a newline; Ctrl-D ends it too;
  2. --interactive with pipes: each translation (an n-best list, ids from 0) can be read before the next
     line is written, so it was flushed at once.
The expected output is that of batch mode on the sentence alone (the same decoding: a batch of one).
Usage: interactive.py TRANSLATE MODEL SENTENCE...
Waiting has a generous limit (60 s a line) so that a hang fails instead of blocking; times are not checked.
"""
import os
import pty
import select
import signal
import subprocess
import sys
import time

LIMIT = 60.0
fails = checks = 0


def check(ok, what):
    global fails, checks
    checks += 1
    if not ok:
        fails += 1
        print("FAIL interactive: %s" % what)
    return ok


def read_until(fd, pattern, buf=b"", lines=0):
    """Reads from fd until `pattern` is in what was read (or it holds `lines` newlines); returns (found, all read)."""
    end = time.monotonic() + LIMIT
    while (buf.count(b"\n") < lines) if lines else (pattern not in buf):
        left = end - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return False, buf
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the terminal closed
            return False, buf
        if not chunk:
            return False, buf
        buf += chunk
    return True, buf


def wait_exit(pid):
    end = time.monotonic() + LIMIT
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def terminal_session(translate, model, pairs, end_key):
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(translate, [translate, "-m", model])
    found, out = read_until(fd, b"> ")
    check(found, "a prompt at the terminal (got %r)" % out)
    for sentence, translation in pairs:
        os.write(fd, sentence.encode() + b"\n")
        # the translation must come back while the next line has not been sent yet
        found, out = read_until(fd, translation.encode() + b"\r\n")
        check(found, "%r is answered with %r before the next line is typed (got %r)" % (sentence, translation, out))
        found, out = read_until(fd, b"> ", out.split(translation.encode() + b"\r\n", 1)[-1])
        check(found, "a new prompt after %r" % sentence)
    rest = b""
    os.write(fd, end_key)
    while True:  # what comes after the last prompt, until the terminal closes
        try:
            r = select.select([fd], [], [], LIMIT)[0]
            chunk = os.read(fd, 4096) if r else b""
        except OSError:
            chunk = b""
        if not chunk:
            break
        rest += chunk
    status = wait_exit(pid)
    name = {b"\x03": "Ctrl-C", b"\x04": "Ctrl-D"}[end_key]
    check(status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0,
          "%s at the prompt exits with status 0 (got %s)" % (name, status))
    check(rest.replace(b"^C", b"").replace(b"^D", b"").strip() == b"",
          "%s: nothing but the echo and a newline after the last prompt (got %r)" % (name, rest))


def batch(translate, model, sentence, *options):
    out = subprocess.run([translate, "-m", model, *options], input=sentence.encode() + b"\n", stdout=subprocess.PIPE,
                         check=True, timeout=LIMIT).stdout.decode()
    return out.splitlines()


def pipe_session(translate, model, sentences):
    p = subprocess.Popen([translate, "-m", model, "--interactive", "--n-best", "2"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for i, sentence in enumerate(sentences):
        want = ["%d%s" % (i, l[1:]) for l in batch(translate, model, sentence, "--n-best", "2")]  # batch says 0: the first line
        p.stdin.write(sentence.encode() + b"\n")
        p.stdin.flush()
        _, got = read_until(p.stdout.fileno(), None, lines=len(want))  # the 2-best list, before the next line is written
        lines = got.decode().splitlines()
        check(lines == want and want[0].startswith("%d ||| " % i),
              "--interactive through a pipe: line %d's 2-best list %r, ids from 0, before the next line (got %r)" % (i, want, lines))
    p.stdin.close()
    rc = p.wait(LIMIT)
    check(rc == 0, "--interactive exits 0 at the end of its input (got %d: %s)" % (rc, p.stderr.read().decode()))


def main():
    translate, model, sentences = sys.argv[1], sys.argv[2], sys.argv[3:]
    pairs = [(s, batch(translate, model, s)[0]) for s in sentences]
    terminal_session(translate, model, pairs, b"\x03")
    terminal_session(translate, model, pairs[:1], b"\x04")
    pipe_session(translate, model, sentences)
    print("interactive: %d checks, %d failed" % (checks, fails))
    return 0 if fails == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
