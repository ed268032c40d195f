"""A warm start for the Jupyter kernels that run the chapters under test: each kernel is forked from a server that has
already imported torch and numpy (about 1.5 of the 2-2.5 CPU-seconds a kernel takes to start and import them), and
then starts as `python -m ipykernel_launcher -f <connection file>` would, in a fresh interpreter state of its own.

Each chapter still runs from a clean namespace, as a user's run does:
- the kernel is a new process; ipykernel is imported and started in it after the fork, so the IPython shell, its
  user namespace and every module a chapter imports besides torch and numpy (lab, matplotlib, ...) are new;
- torch and numpy were imported under the same interpreter, flags and environment as the kernel's own: a request
  whose environment differs from the server's in anything but the FREE variables below (LAB_*, JPY_*, pytest's
  PYTEST_CURRENT_TEST, the terminal size: no preloaded module reads them; ipykernel reads JPY_PARENT_PID at its
  import, which is why it is not preloaded) is not served, and the client runs the ordinary kernel command instead
  (exec, the same process);
- the kernel gets the request's environment, working folder, standard streams, sys.argv and sys.path[0] (the
  working folder, as -m sets it), and new seeds for `random` and numpy's global generator (torch's default
  generator starts from its fixed seed at import, as in any process). String hashes keep the server's seed, as
  with a fixed PYTHONHASHSEED.
- the server refuses to fork once a Python thread besides its own runs (a fork copies only the calling thread); the
  native pool numpy's OpenBLAS starts (one thread under make test, where OMP_NUM_THREADS=1) is shut down by its
  own pthread_atfork handler before each fork and started again in the kernel when it first needs it.

The client is the process jupyter_client starts and watches: it forwards the signals it gets (an interrupt) to the
kernel and exits with the kernel's status; if the client is killed, the server kills the kernel. The kernel's parent
is the server, so ipykernel's parent poller watches that (JPY_PARENT_PID names the test process: the poller then
waits for the kernel to be orphaned); the server exits, killing its kernels, once the test process is gone.

    python warm_kernel.py serve SOCKET       the server (started by `manager_class`)
    python warm_kernel.py client SOCKET -- CMD...   what the kernel manager launches in place of CMD
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

PRELOAD = ("torch", "numpy")
# environment variables a request may set differently from the server's: the lab's, jupyter_client's, pytest's name
# of the running test and the terminal size that some library exports in the test process (COLUMNS/LINES come and
# go there), none of which torch or numpy reads
FREE = ("LAB_", "JPY_", "PYTEST_CURRENT_TEST", "COLUMNS", "LINES")


def _signature(env: dict) -> dict:
    return {k: v for k, v in env.items() if not k.startswith(FREE)}


def _kernel_cmd(cmd: list[str]) -> bool:
    """The one command the server stands in for: this interpreter running ipykernel_launcher on a connection file
    (nbclient adds options after it)."""
    return len(cmd) >= 5 and cmd[0] == sys.executable and cmd[1:3] == ["-m", "ipykernel_launcher"] and cmd[3] == "-f"


def _send(conn: socket.socket, payload: dict) -> None:
    data = json.dumps(payload).encode()
    conn.sendall(struct.pack("!I", len(data)) + data)


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


# ------------------------------------------------------------------ the server

def serve(path: str) -> None:
    for name in PRELOAD:
        __import__(name)
    env0, parent = dict(os.environ), os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    children: dict[int, socket.socket] = {}  # kernel pid -> its client's connection
    conns: dict[socket.socket, int] = {}
    try:
        while os.getppid() == parent:
            ready, _, _ = select.select([listener, *conns], [], [], 0.1)
            for sock in ready:
                if sock is listener:
                    conn, _ = listener.accept()
                    try:
                        pid = _start(conn, listener, conns, env0)
                    except (OSError, EOFError, ValueError, KeyError):  # a client gone or garbled: it alone fails
                        pid = None
                    if pid:
                        children[pid], conns[conn] = conn, pid
                    else:
                        conn.close()
                    continue
                try:
                    data = sock.recv(4)
                except OSError:
                    data = b""
                pid = conns[sock]
                if len(data) == 4:  # a signal the client got
                    os.kill(pid, struct.unpack("!i", data)[0])
                else:  # the client is gone (killed): so is its kernel
                    os.kill(pid, signal.SIGKILL)
                    del conns[sock]
                    sock.close()
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if not pid:
                    break
                conn = children.pop(pid)
                if conn in conns:
                    del conns[conn]
                    try:
                        conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
                    except OSError:
                        pass
                    conn.close()
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        listener.close()
        for name in (path, os.path.dirname(path)):  # the socket and the folder `manager_class` made for it
            try:
                os.rmdir(name) if name != path else os.unlink(name)
            except OSError:
                pass


def _start(conn: socket.socket, listener: socket.socket, conns: dict, env0: dict) -> int | None:
    """Read one request; fork its kernel and answer {"pid"}, or answer {"refused": why} and fork nothing."""
    msg, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)  # the descriptors ride with the message's first bytes
    msg += _recv_exact(conn, max(0, 4 - len(msg)))
    length = struct.unpack("!I", msg[:4])[0]
    msg = msg[4:] + _recv_exact(conn, max(0, length + 4 - len(msg)))
    request = json.loads(msg)
    why = None
    if not _kernel_cmd(request["cmd"]):
        why = f"not the kernel command this server stands in for: {request['cmd']}"
    elif _signature(request["env"]) != _signature(env0):
        differ = sorted(set(_signature(request["env"]).items()) ^ set(_signature(env0).items()))
        why = f"environment differs from the server's in {sorted({k for k, _ in differ})}"
    elif threading.active_count() != 1:
        why = "the server runs a Python thread besides its own"
    elif len(fds) != 3:
        why = "no standard streams passed"
    if why:
        _send(conn, {"refused": why})
        for fd in fds:
            os.close(fd)
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the kernel; it never returns into the server's loop
        code = 1
        try:
            listener.close()
            for other in conns:
                other.close()
            conn.close()
            code = _become_kernel(request, fds)
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)
    _send(conn, {"pid": pid})
    return pid


def _become_kernel(request: dict, fds: list[int]) -> None:
    import random
    import runpy

    import numpy

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = os.getcwd()  # what `python -m` puts first
    random.seed()
    numpy.random.seed()
    sys.argv = ["-m", *request["cmd"][3:]]  # runpy sets argv[0] to the module's file, as -m does
    code = 0
    try:
        runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    # the end of an interpreter, as after `python -m`: wait for non-daemon threads, run the atexit handlers
    import atexit as exits
    import threading

    threading._shutdown()
    exits._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


# ------------------------------------------------------------------ the client

def client(path: str, cmd: list[str]) -> None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        data = json.dumps({"cmd": cmd, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
        socket.send_fds(conn, [struct.pack("!I", len(data)) + data], [0, 1, 2])
        length = struct.unpack("!I", _recv_exact(conn, 4))[0]
        answer = json.loads(_recv_exact(conn, length))
    except (OSError, EOFError) as err:
        answer = {"refused": f"no server at {path}: {err}"}
    if "refused" in answer:
        print(f"warm kernel: {answer['refused']}; starting the kernel as usual", file=sys.stderr, flush=True)
        conn.close()
        os.execv(cmd[0], cmd)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, lambda s, _: conn.sendall(struct.pack("!i", s)))
    while True:
        try:
            code = struct.unpack("!i", _recv_exact(conn, 4))[0]
            break
        except InterruptedError:
            continue
        except EOFError:  # the server is gone
            code = 1
            break
    sys.exit(code if code >= 0 else 128 - code)


# ------------------------------------------------------------------ the test side

_servers: dict[str, tuple[subprocess.Popen, str]] = {}


def manager_class():
    """A jupyter_client kernel manager class whose kernels are forked from a warm server started for the current
    environment (one per distinct environment, less LAB_*/JPY_*, per process; stopped at exit)."""
    from jupyter_client.manager import AsyncKernelManager

    signature = json.dumps(_signature(dict(os.environ)), sort_keys=True)
    if signature not in _servers or _servers[signature][0].poll() is not None:
        folder = tempfile.mkdtemp(prefix="warm-kernel-")
        path = os.path.join(folder, "socket")
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve", path], stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if not os.path.exists(path):
            proc.kill()
            raise RuntimeError(f"the warm kernel server did not start (exit status {proc.poll()})")
        if not _servers:
            atexit.register(_stop)
        _servers[signature] = (proc, path)
    path = _servers[signature][1]

    class WarmKernelManager(AsyncKernelManager):
        def format_kernel_cmd(self, extra_arguments=None):
            cmd = super().format_kernel_cmd(extra_arguments)
            return [sys.executable, "-I", "-S", os.path.abspath(__file__), "client", path, "--", *cmd]

    return WarmKernelManager


def _stop() -> None:
    for proc, path in _servers.values():
        proc.kill()
        proc.wait()
        try:
            os.unlink(path)
            os.rmdir(os.path.dirname(path))
        except OSError:
            pass


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif sys.argv[1] == "client" and sys.argv[3] == "--":
        client(sys.argv[2], sys.argv[4:])
    else:
        sys.exit(f"usage: {sys.argv[0]} serve SOCKET | client SOCKET -- CMD...")
