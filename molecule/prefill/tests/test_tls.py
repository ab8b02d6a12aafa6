"""With llama_rpc_transport tls the cluster serves through both workers over mutual TLS, and nothing without a
certificate of the cluster CA for client use (the master's) reaches an RPC server."""

import datetime
import ipaddress
import re
import subprocess

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cluster_helpers import RPC_PORT, WORKERS, address, listeners, main_pid, option
from tls_helpers import (CA_DIR, TLS_DIR, cert_fields, cluster_completion, local_endpoints, network_endpoints, probe,
                         refused, rpc_connections, server_args, single_process_completion, write_file)

UNITS = {"master": ["llama-server.service", "llama-rpc-tls-clients.service"],
         "worker": ["llama-rpc-server.service", "llama-rpc-tls.service"]}
# A real RPC server's answer to the hello: u64 LE 3, then protocol 7.0.0.
RPC_HELLO_REPLY = "0300000000000000070000"


def test_units_active_enabled_and_run_as_llama(master, workers):
    for host, units in [(master, UNITS["master"])] + [(worker, UNITS["worker"]) for worker in workers.values()]:
        for unit in units:
            assert host.service(unit).is_running, unit
            assert host.service(unit).is_enabled, unit
            assert host.process.get(pid=main_pid(host, unit)).user == "llama", unit


def test_rpc_server_listens_on_loopback_and_the_terminator_on_the_cluster_address(workers):
    for worker in workers.values():
        ip = address(worker)
        assert listeners(worker, RPC_PORT) == {f"127.0.0.1:{RPC_PORT}": "llama-rpc-server.service",
                                               f"{ip}:{RPC_PORT}": "llama-rpc-tls.service"}
        # Nothing of the RPC server is queued (a probe that reached it would wait in its accept queue).
        queued = worker.check_output(f"ss -Hltn src 127.0.0.1:{RPC_PORT}").split()[1]
        assert queued == "0"


def test_master_dials_its_local_tls_clients(master, workers):
    args = server_args(master)
    assert option(args, "--rpc") == ",".join(local_endpoints())
    for endpoint in local_endpoints():
        port = endpoint.rsplit(":", 1)[1]
        assert listeners(master, port) == {endpoint: "llama-rpc-tls-clients.service"}
    # Its start waits for the RPC handshake through the endpoints it dials: the local clients, the terminators
    # and the RPC servers behind them all answer before llama-server starts.
    unit = master.check_output("systemctl show -p ExecStartPre --value llama-server.service")
    for name, endpoint in zip(WORKERS, local_endpoints()):
        assert f"{name}={endpoint}" in unit
    # And llama-server holds its connections through the clients, which hold theirs to the terminators.
    for endpoint, worker_endpoint in zip(local_endpoints(), network_endpoints(workers)):
        assert "/llama-server.service" in master.check_output(f"ss -Htne state established dst {endpoint}")
        assert "/llama-rpc-tls-clients.service" in master.check_output(
            f"ss -Htne state established dst {worker_endpoint}")


def test_cluster_over_tls_gives_the_single_process_output(master):
    cluster = cluster_completion(master)
    assert cluster["tokens_predicted"] == 16
    alone = single_process_completion(master)
    assert alone["tokens_predicted"] == 16
    assert cluster["content"] == alone["content"]


def test_certificates(master, workers):
    ca = f"{TLS_DIR}/ca.crt"
    for name, host in [("master", master), *workers.items()]:
        fields = cert_fields(host)
        assert fields["san"] == f"IP Address:{address(host)}, DNS:{name}"
        assert fields["eku"] == ("TLS Web Client Authentication" if name == "master" else
                                 "TLS Web Server Authentication")
        assert host.run(f"openssl verify -CAfile {ca} -purpose any {TLS_DIR}/host.crt").rc == 0
        key = host.file(f"{TLS_DIR}/host.key")
        assert (key.user, key.group, key.mode) == ("root", "llama", 0o640)


def test_ca_key_stays_on_the_controller(master, workers):
    key = CA_DIR / "ca.key"
    assert key.is_file() and oct(key.stat().st_mode & 0o777) == "0o600"
    assert oct(CA_DIR.stat().st_mode & 0o777) == "0o700"
    # A line of the key's base64 body, searched for on every host (no copy anywhere, under any name).
    body = max(key.read_text().splitlines()[1:-1], key=len)
    ca_public = subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout"], capture_output=True, text=True,
                               check=True).stdout
    for host in (master, *workers.values()):
        assert host.run(f"grep -rlF -- {body!r} /etc /root /var /opt /srv /tmp /home").stdout == ""
        assert sorted(host.file(TLS_DIR).listdir()) in (
            ["ca.crt", "host.crt", "host.key", "llama-rpc-tls-clients.conf"],
            ["ca.crt", "host.crt", "host.key", "llama-rpc-tls.conf"])
        assert host.check_output(f"openssl pkey -in {TLS_DIR}/host.key -pubout") != ca_public.strip()


@pytest.fixture(scope="module")
def forwarded_before(workers):
    return {name: rpc_connections(worker) for name, worker in workers.items()}


def test_no_rpc_answer_in_clear(master, workers, forwarded_before):
    """The master can reach the port (the firewall admits it): in clear, the terminator answers nothing."""
    for worker in workers.values():
        result = probe(master, address(worker), mode="plain")
        assert RPC_HELLO_REPLY not in result.get("reply", ""), result


def test_no_rpc_answer_without_a_client_certificate(master, workers, forwarded_before):
    for worker in workers.values():
        refused(master, worker, "peer did not return a certificate")


def test_a_certificate_of_another_ca_is_refused(master, workers, forwarded_before):
    ip = address(master)
    made = master.run(
        "set -e; cd /tmp && rm -rf otherca && mkdir otherca && cd otherca; "
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.crt "
        "-days 30 -subj '/CN=Another CA' 2>/dev/null; "
        "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout client.key -out client.csr "
        "-subj /CN=master 2>/dev/null; "
        f"printf 'subjectAltName=IP:{ip},DNS:master\\nextendedKeyUsage=clientAuth\\n' > ext; "
        "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 -extfile ext "
        "-out client.crt 2>/dev/null")
    assert made.rc == 0, made.stderr
    for worker in workers.values():
        refused(master, worker, "unable to get local issuer certificate", cert="/tmp/otherca/client")


def test_a_cluster_certificate_not_for_client_use_is_refused(master, workers, forwarded_before):
    """A worker's own certificate (the cluster CA's, for servers) opens no connection to another worker."""
    worker1, worker2 = (workers[name] for name in WORKERS)
    write_file(master, "/tmp/worker2.crt", worker2.file(f"{TLS_DIR}/host.crt").content_string)
    write_file(master, "/tmp/worker2.key", worker2.file(f"{TLS_DIR}/host.key").content_string)
    refused(master, worker1, "unsuitable certificate purpose", cert="/tmp/worker2")


def test_a_client_certificate_of_the_ca_for_another_address_is_refused(master, workers, forwarded_before):
    """Signed by the cluster CA, for client use, but naming another host's address: the terminator checks the
    master's address too (checkIP)."""
    key = ec.generate_private_key(ec.SECP256R1())
    ca_key = serialization.load_pem_private_key((CA_DIR / "ca.key").read_bytes(), password=None)
    ca = x509.load_pem_x509_certificate((CA_DIR / "ca.crt").read_bytes())
    now = datetime.datetime.now(datetime.timezone.utc)
    elsewhere = ipaddress.ip_address(address(workers["worker2"]))
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "master")]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(elsewhere), x509.DNSName("master")]), False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
            .sign(ca_key, hashes.SHA256()))
    write_file(master, "/tmp/elsewhere.crt", cert.public_bytes(serialization.Encoding.PEM).decode())
    write_file(master, "/tmp/elsewhere.key", key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode())
    refused(master, workers["worker1"], "Subject checks failed", cert="/tmp/elsewhere")


def test_refused_clients_never_reached_an_rpc_server(master, workers, forwarded_before):
    """stunnel connects to the RPC server only after a successful handshake: none of the probes above took the
    RPC server's one client slot, and the cluster still serves."""
    for name, worker in workers.items():
        assert rpc_connections(worker) == forwarded_before[name]
        log = worker.check_output("journalctl -o cat -u llama-rpc-tls.service")
        assert "Rejected by CERT" in log
        assert worker.check_output(f"ss -Hltn src 127.0.0.1:{RPC_PORT}").split()[1] == "0"
    assert cluster_completion(master)["tokens_predicted"] == 16


def test_units_sandboxed(master, workers):
    for host, unit in [(master, "llama-rpc-tls-clients.service")] + [(w, "llama-rpc-tls.service")
                                                                    for w in workers.values()]:
        exposure = host.check_output(f"systemd-analyze security --no-pager {unit} | tail -n 1")
        level = float(re.search(r"level for \S+: ([\d.]+)", exposure).group(1))
        assert level <= 2.0, exposure
        print(f"{unit}: {exposure}")
