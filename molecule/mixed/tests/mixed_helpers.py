"""What the mixed scenario's test files share: the commit the converge deploys and the one upgrade.yml moves to,
and the build each node runs."""

import json
import os
from pathlib import Path

# The commit the converge deploys (0c1e570 from its archive, with the cluster scenario's build settings: the same build
# identity, so that its Debian 12 artifact is reused), and the one upgrade.yml moves to: 2cabdd3, the same sources
# from the git fixture (the upgrade scenario moves across RPC protocols; this one across releases).
COMMIT = os.environ["LLAMA_SRC_0_3_36_COMMIT"]
NEW_COMMIT = os.environ["LLAMA_GIT_0_3_36_COMMIT"]
NEW_VARS = json.dumps({"llamacpp_commit": NEW_COMMIT, "llamacpp_source": "git"})
# The share of a group's compilations the compiler cache answers for the same sources at another commit (the path of
# the source tree is the same for every commit): all but build-info, which carries the commit.
CACHED_SHARE = 0.9
# Instance b's RPC port (test_instances.py): llama_rpc_port (50052) + 1.
B_RPC = 50053
ASK = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0, "seed": 42, "cache_prompt": False}


def build(host):
    return json.loads(host.file("/opt/llama.cpp/current/BUILD-INFO.json").content_string)


def ledger():
    return (Path(os.environ["LLAMA_ARTIFACT_CACHE"]) / "builds.log").read_text().splitlines()
