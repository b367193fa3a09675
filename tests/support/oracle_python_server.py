"""The oracles' Python, imported once: a fork server for the tests' Python oracles.

Importing torch and transformers costs a test's Python oracle 5 to 7 s of CPU before its first line runs, and
the suite starts such oracles about 40 times (measured with process accounting: 263 s of CPU in python, most
of it imports). This server imports them once; each oracle runs in a child forked from it, with the client's
arguments, working directory, environment and standard streams (passed over the socket), and the client exits
with the child's status. The code that runs is the same script under the same interpreter and packages; only
the imports are shared. tests/support/oracle_python.in is the client; it falls back to a plain python when no
server answers, so a test run by hand behaves the same.

The server never runs a torch operation itself (a forked child of a process that has started OpenMP threads
can hang), leaves when it has been idle for IDLE_SECONDS, and stops on a "stop" request.
"""
import importlib
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback

IDLE_SECONDS = 180
PRELOAD = ["numpy", "torch", "safetensors.torch", "tokenizers", "tiktoken", "jinja2", "transformers", "peft"]
# transformers imports a model's module on first use of its name: these are the oracles' models.
PRELOAD_TRANSFORMERS = ["AutoModelForCausalLM", "AutoTokenizer", "PreTrainedTokenizerFast", "GPT2LMHeadModel",
                        "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM",
                        "Phi3ForCausalLM", "RobertaForMaskedLM",
                        "RobertaTokenizerFast", "pipeline"]


def preload():
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # an oracle that needs it reports the import error itself
            pass
    try:
        import transformers
        for name in PRELOAD_TRANSFORMERS:
            getattr(transformers, name, None)
    except Exception:
        pass


def receive_request(connection):
    """The client's request: a 4-byte length, JSON {argv, cwd, env}, and its stdin, stdout, stderr."""
    header = b""
    fds = []
    while len(header) < 4:
        data, ancillary, _, _ = connection.recvmsg(4 - len(header), socket.CMSG_SPACE(3 * 4))
        if not data:
            raise EOFError("the client left before its request")
        header += data
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += list(struct.unpack(f"{len(payload) // 4}i", payload[: len(payload) - len(payload) % 4]))
    (length,) = struct.unpack("!I", header)
    body = b""
    while len(body) < length:
        data = connection.recv(length - len(body))
        if not data:
            raise EOFError("the client left in the middle of its request")
        body += data
    return json.loads(body), fds


def exit_status(error):
    """What `python script.py` exits with when the script raised SystemExit(error.code)."""
    code = error.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def run_request(request):
    """In the child: become the client's python and run its script (or -c code); returns the exit status."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    if argv[0] == "-c":
        sys.argv = ["-c"] + argv[2:]
        sys.path[0] = ""
        code, filename = argv[1], "<string>"
    else:
        script = os.path.abspath(argv[0])
        sys.argv = [argv[0]] + argv[1:]
        sys.path[0] = os.path.dirname(script)
        with open(script, "rb") as source:
            code, filename = source.read(), script
    main = type(sys)("__main__")
    main.__file__ = filename if filename != "<string>" else None
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    try:
        exec(compile(code, filename, "exec"), main.__dict__)
        return 0
    except SystemExit as error:
        return exit_status(error)
    except BaseException:
        traceback.print_exc()
        return 1


def exit_with_client(connection):
    """A client killed (a ctest timeout) takes its oracle with it: the client never writes after its request."""
    try:
        connection.recv(1)
    except OSError:
        pass
    os._exit(1)


def serve_child(connection, request, fds):
    """The forked child: its client's streams in place of the server's, the script run, the status sent back."""
    try:
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        connection.sendall(struct.pack("!i", os.getpid()))
        threading.Thread(target=exit_with_client, args=(connection,), daemon=True).start()
        status = run_request(request)
    except BaseException:
        traceback.print_exc()
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    try:
        connection.sendall(struct.pack("!i", status))
    except OSError:
        pass
    os._exit(status)


def main():
    address = "\0" + sys.argv[1]  # an abstract socket name (the client's)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address)
    except OSError:  # another client started one first
        return 0
    preload()
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    last_activity = time.monotonic()
    while True:
        ready, _, _ = select.select([listener], [], [], 5)
        if not ready:
            if time.monotonic() - last_activity > IDLE_SECONDS:
                return 0
            continue
        connection, _ = listener.accept()
        last_activity = time.monotonic()
        try:
            request, fds = receive_request(connection)
        except (EOFError, OSError, ValueError):
            connection.close()
            continue
        if request.get("stop"):
            return 0
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            serve_child(connection, request, fds)
        for fd in fds:
            os.close(fd)
        connection.close()


if __name__ == "__main__":
    sys.exit(main())
