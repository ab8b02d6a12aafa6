"""The collection `make collection` builds from the checkout, installed into an empty collections path and used by
its fully qualified names against this scenario's hosts, from outside the checkout: its site playbook deploys the
cluster (converged already by the checkout's site.yml: nothing changes, which shows the two are the same), its
status playbook reads every node (its module, its filters, its roles) and finds the cluster healthy; a play of the
user's own calls its planner filter and its module by their full names."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_helpers import recap

PROJECT = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
sys.path.insert(0, str(PROJECT / "tools"))
import collection  # noqa: E402

OWN_PLAY = f"""
- name: A play of a user of the collection
  hosts: llama_master
  gather_facts: false
  tasks:
    - name: Read the master by the module's full name
      {collection.FQCN}.llama_node_status:
        units: [llama-server.service]
        server_unit: llama-server.service
      register: read
    - name: Plan a model by the filter's full name
      ansible.builtin.debug:
        msg: "{{{{ [{{'name': 'RPC0', 'memory_mib': 1024}}] | {collection.FQCN}.llama_split_plan(model) }}}}"
      vars:
        model: {{n_layer: 2, layer_bytes: 1048576, output_bytes: 1048576, kv_bytes_per_token: 0}}
      register: plan
    - name: Say both
      ansible.builtin.debug:
        msg: "RESULT {{{{ {{'server': read.units[0].active_state, 'split': plan.msg.tensor_split}} | to_json }}}}"
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    work = tmp_path_factory.mktemp("collection")
    tarball = collection.build(work / "dist")
    # The scenario's connection settings (molecule's ansible.cfg: SSH options and control path), and nothing of the
    # checkout: no collection, filter, module, action or role path of it.
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("ANSIBLE_FILTER", "ANSIBLE_LIBRARY", "ANSIBLE_ACTION", "ANSIBLE_MODULE_UTILS",
                                  "ANSIBLE_ROLES", "ANSIBLE_COLLECTIONS"))}
    env["ANSIBLE_COLLECTIONS_PATH"] = str(work / "collections")  # and the ansible package's, on sys.path
    env["ANSIBLE_CONFIG"] = str(Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "ansible.cfg")
    done = subprocess.run(["ansible-galaxy", "collection", "install", "--offline", "--no-deps", "-p",
                           str(work / "collections"), str(tarball)], cwd=work, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return work, env


def play(installed, *args):
    work, env = installed
    return subprocess.run(["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)


def test_the_collection_s_site_playbook_deploys_the_cluster(installed):
    """ansible-playbook llamacpp.rpc_cluster.site, as a user of the installed collection runs it: every play runs,
    on every host, and finds the cluster as the checkout's site.yml left it."""
    done = play(installed, f"{collection.FQCN}.site")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    stats = recap(done.stdout)
    assert {"master", "worker1", "worker2"} <= set(stats), stats
    assert all(counts["changed"] == 0 and counts["failed"] == 0 for counts in stats.values()), done.stdout[-4000:]


def test_the_collection_s_status_playbook_by_its_fqcn(installed):
    done = play(installed, f"{collection.FQCN}.status")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert re.search(r"^\s+healthy$", done.stdout, re.M), done.stdout[-3000:]


def test_a_user_s_play_calls_the_module_and_a_filter_by_their_fqcn(installed):
    work, _ = installed
    (work / "own.yml").write_text(OWN_PLAY)
    done = play(installed, str(work / "own.yml"))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1].split("\n", 1)[0].rstrip("'\""))
    assert result == {"server": "active", "split": [3]}
