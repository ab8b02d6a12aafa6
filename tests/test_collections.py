"""The installed collections satisfy what the project declares (for users who install from Galaxy instead): the
runtime ones of requirements.yml and galaxy.yml's `dependencies`, the test-only ones of tests/requirements.yml."""

import json
import subprocess

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version


def satisfies(version, spec):
    """Whether `version` meets every clause of a Galaxy version range (">=2.0.0,<3.0.0"), pre-releases included,
    except (PEP 440) a pre-release of an excluded upper bound: 3.0.0-rc.1 is not <3.0.0."""
    return SpecifierSet(spec).contains(Version(version), prereleases=True)


def declared(project, source):
    """{collection: version range} of one of the files that declare collections."""
    data = yaml.safe_load((project / source).read_text())
    if source == "galaxy.yml":
        return dict(data.get("dependencies") or {})
    return {entry["name"]: entry["version"] for entry in data["collections"]}


@pytest.fixture(scope="module")
def installed():
    listing = subprocess.run(["ansible-galaxy", "collection", "list", "--format", "json"],
                             capture_output=True, text=True, check=True).stdout
    found = {}
    for collections in json.loads(listing).values():
        for name, info in collections.items():
            found.setdefault(name, info["version"])
    return found


@pytest.mark.parametrize("source", ["requirements.yml", "galaxy.yml", "tests/requirements.yml"])
def test_installed_collections_satisfy_the_declared_versions(project, installed, source):
    wanted = declared(project, source)
    assert wanted, f"{source} declares no collection"
    for name, spec in wanted.items():
        assert name in installed, f"{name} ({source}) is not installed"
        assert satisfies(installed[name], spec), f"{name} {installed[name]} does not satisfy {spec} ({source})"


@pytest.mark.parametrize("version, spec, expected", [
    ("2.1.0", ">=2.0.0,<3.0.0", True),
    ("3.0.0", ">=2.0.0,<3.0.0", False),
    ("1.9.9", ">=2.0.0,<3.0.0", False),
    ("11.4.2", ">=11.0.0,<12.0.0", True),
    ("4.8.5", "==4.8.5", True),
    ("4.8.5", "!=4.8.5", False),
    ("4.8.5", ">4.8.5", False),
    ("4.8.5", "<=4.8.5", True),
    ("2.0.0-beta.1", ">=1.0.0", True),
    ("3.0.0-rc.1", ">=2.0.0,<3.0.0", False),
])
def test_satisfies_reads_galaxy_version_ranges(version, spec, expected):
    assert satisfies(version, spec) is expected
