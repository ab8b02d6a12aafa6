"""What the prefill scenario's TLS tests share: the TLS endpoints, the RPC probe, certificates, the greedy
completion."""

import json
import os
import re
from pathlib import Path
from shlex import quote

from cluster_helpers import RPC_PORT, SERVER_PORT, WORKERS, address, cmdline, http_json, main_pid, option, wait_health
from cluster_helpers import single_process_completion as one_process_completion

TLS_DIR = "/etc/llama.cpp/tls"
CLIENT_PORT = 50100  # llama_tls_client_port's default
# The CA on the controller: <inventory dir>/llama-tls (llama_tls_ca_dir's default).
CA_DIR = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent / "llama-tls"
# Greedy and fixed: the same text from any correct placement of the layers.
PROMPT = {"prompt": "Once upon a time", "n_predict": 16, "temperature": 0, "seed": 1234,
          # Re-evaluating a cached prompt token shifts the numbers slightly; random weights make near-ties.
          "cache_prompt": False}
SINGLE_PORT = 18182

# LLAMACPP.md "Probe": RPC hello for servers >= 4.0 (byte 14, u64 LE 24, 24 zero bytes); a server answers with
# u64 LE n, then n bytes (major, minor, patch first). Over TCP (plain) or TLS (with or without a certificate);
# prints what came back, if anything.
PROBE = r"""
import json, socket, ssl, struct, sys
host, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cert = sys.argv[4] if len(sys.argv) > 4 else None
hello = bytes([14]) + struct.pack("<Q", 24) + bytes(24)
result = {}
sock = socket.create_connection((host, port), timeout=10)
try:
    if mode == "tls":
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        if cert:
            context.load_cert_chain(cert + ".crt", cert + ".key")
        sock = context.wrap_socket(sock)
        result["handshake"] = sock.version()
    sock.sendall(hello)
    reply = b""
    while len(reply) < 11:
        chunk = sock.recv(64)
        if not chunk:
            break
        reply += chunk
    result["reply"] = reply.hex()
except (OSError, ssl.SSLError) as error:
    result["error"] = f"{type(error).__name__}: {error}"
print(json.dumps(result))
"""


def probe(host, target, port=RPC_PORT, mode="tls", cert=None):
    """{handshake?, reply (hex) | error} of the RPC hello sent from `host` to target:port."""
    result = host.run(f"timeout 30 python3 -c {quote(PROBE)} {target} {port} {mode} {quote(cert or '')}")
    assert result.rc == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def write_file(host, path, text, mode="0600"):
    result = host.run(f"install -m {mode} /dev/null {path} && cat > {path} <<'PEM'\n{text.strip()}\nPEM")
    assert result.rc == 0, result.stderr


def cert_fields(host, path=f"{TLS_DIR}/host.crt"):
    """serial, notBefore, notAfter, subjectAltName and extendedKeyUsage of a certificate on a host."""
    text = host.check_output(f"openssl x509 -in {path} -noout -serial -startdate -enddate "
                             "-ext subjectAltName,extendedKeyUsage")
    fields = dict(re.findall(r"^(serial|notBefore|notAfter)=(.*)$", text, re.M))
    fields["san"] = re.search(r"Subject Alternative Name:.*\n\s+(.*)", text).group(1).strip()
    fields["eku"] = re.search(r"Extended Key Usage:.*\n\s+(.*)", text).group(1).strip()
    return fields


def presented_serial(host, target, port=RPC_PORT):
    """The serial of the certificate a TLS endpoint presents (the handshake then fails: no client certificate)."""
    return host.check_output(f"openssl s_client -connect {target}:{port} </dev/null 2>/dev/null "
                             "| openssl x509 -noout -serial").removeprefix("serial=")


def journal_cursor(worker, unit="llama-rpc-tls.service"):
    """Where the unit's journal ends now (for terminator_log)."""
    return worker.check_output(f"journalctl -u {unit} -n 0 --show-cursor").split("cursor: ", 1)[1].strip()


def terminator_log(worker, cursor):
    """What the worker's TLS terminator logged after `cursor`."""
    return worker.check_output(f"journalctl -o cat -u llama-rpc-tls.service --after-cursor {quote(cursor)}")


def refused(master, worker, reason, cert=None, mode="tls"):
    """Probe the worker's RPC port from the master: no RPC reply, and its terminator logged `reason`."""
    cursor = journal_cursor(worker)
    result = probe(master, address(worker), mode=mode, cert=cert)
    assert result.get("reply", "") == "" and "error" in result, result
    log = terminator_log(worker, cursor)
    assert reason in log and "s_connect" not in log, log
    return result


def rpc_connections(worker):
    """How many connections the worker's terminator ever forwarded to the RPC server (journal)."""
    log = worker.check_output("journalctl -o cat -u llama-rpc-tls.service")
    return log.count("s_connect: connected 127.0.0.1:")


def server_args(master):
    return cmdline(master, main_pid(master, "llama-server.service"))


def local_endpoints():
    return [f"127.0.0.1:{CLIENT_PORT + index}" for index, _ in enumerate(WORKERS)]


def network_endpoints(workers):
    return [f"{address(workers[name])}:{RPC_PORT}" for name in WORKERS]


def cluster_completion(master, body=None):
    wait_health(master, SERVER_PORT)
    return http_json(master, SERVER_PORT, "/completion", body or PROMPT)


def single_process_completion(master, body=None):
    """The same request to a llama-server of one process (no RPC) on the master, started for it."""
    return one_process_completion(master, option(server_args(master), "-m"), body or PROMPT, SINGLE_PORT)
