#!/usr/bin/python
"""Ansible module llama_files: a role's small files (units, configuration, scripts) in place, in one module run."""

from __future__ import annotations

DOCUMENTATION = r"""
module: llama_files
short_description: Put several small files in place, with their content, mode and owner, in one run
description:
  - Each file of O(files) gets the content, mode, owner and group given; a file that already has them is left
    alone. A changed file is written to a temporary file in its directory and renamed over the old one, so a
    reader sees the old content or the new, never a part.
  - The same work as one M(ansible.builtin.copy) task per file (content rendered on the controller, for example with
    the P(ansible.builtin.template#lookup) lookup), but one module run for all of them where M(ansible.builtin.copy)
    and M(ansible.builtin.template) take two per file (a C(stat), then the M(ansible.builtin.file) module) even when
    nothing changes. A role's units and configuration files are many small files written on every run, so this
    halves the module runs of a run that changes nothing.
  - For text only (units, configuration, scripts); large or binary files belong to M(ansible.builtin.copy).
options:
  files:
    description: The files, each a dict.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: Where the file goes. Its directory must exist.
        type: path
        required: true
      content:
        description: The file's whole content (text, written as UTF-8).
        type: str
        required: true
      mode:
        description: Its permissions, an octal string such as C("0644").
        type: str
        required: true
      owner:
        description: Its owner (a user name).
        type: str
        default: root
      group:
        description: Its group (a group name).
        type: str
        default: root
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Nothing is written; the result says what would change.
  diff_mode:
    description: Returns what changed (or would change, in check mode) in diff mode.
    support: full
    details: One diff per changed file (its content; a changed mode or owner shows in the header).
notes:
  - A symbolic link at a file's path is replaced by a regular file.
author: llamacpp-rpc-cluster maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Install the exporter's units
  llamacpp.rpc_cluster.llama_files:
    files:
      - path: /etc/systemd/system/llama-cluster-exporter.service
        content: "{{ lookup('ansible.builtin.template', 'llama-cluster-exporter.service.j2') }}"
        mode: "0644"
      - path: /etc/systemd/system/llama-cluster-exporter.timer
        content: "{{ lookup('ansible.builtin.template', 'llama-cluster-exporter.timer.j2') }}"
        mode: "0644"
  register: __units
  notify: Restart the exporter's timer
"""

RETURN = r"""
changed_files:
  description: The paths written (in check mode, that would be), in the order given.
  returned: always
  type: list
  elements: str
"""

import grp
import os
import pwd
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule


def wanted_ids(owner, group):
    """(uid, gid) of the names; a KeyError names the missing one."""
    try:
        uid = pwd.getpwnam(owner).pw_uid
    except KeyError as error:
        raise KeyError(f"no user {owner!r}") from error
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError as error:
        raise KeyError(f"no group {group!r}") from error
    return uid, gid


def current(path):
    """(content bytes, mode bits, uid, gid) of the regular file at `path`, or None where there is none."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    with open(path, "rb") as handle:
        return handle.read(), stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid


def plan(spec):
    """What one file needs: {path, data, mode, uid, gid, before (text or None), content, attributes}."""
    path, data = spec["path"], spec["content"].encode("utf-8")
    mode = int(spec["mode"], 8)
    uid, gid = wanted_ids(spec["owner"], spec["group"])
    found = current(path)
    before = None if found is None else found[0]
    return {"path": path, "data": data, "mode": mode, "uid": uid, "gid": gid,
            "before": before, "content": before != data,
            "attributes": found is not None and found[1:] != (mode, uid, gid)}


def unplanned(spec):
    """A file of check mode whose directory, user or group a real run makes first: it would be written."""
    return {"path": spec["path"], "data": spec["content"].encode("utf-8"), "mode": int(spec["mode"], 8),
            "uid": spec["owner"], "gid": spec["group"], "before": None, "content": True, "attributes": False}


def write(item):
    """The file's new content, mode and owner, renamed into place."""
    directory = os.path.dirname(item["path"]) or "."
    handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(item['path'])}.", dir=directory)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(item["data"])
        os.chown(temporary, item["uid"], item["gid"])
        os.chmod(temporary, item["mode"])
        os.replace(temporary, item["path"])
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def settle(item):
    """Mode and owner only (the content is right)."""
    os.chown(item["path"], item["uid"], item["gid"], follow_symlinks=False)
    os.chmod(item["path"], item["mode"])


def diff(item):
    header = item["path"] + (f" (mode {item['mode']:04o}, owner {item['uid']}:{item['gid']})"
                             if item["attributes"] else "")
    before = "" if item["before"] is None else item["before"].decode("utf-8", "replace")
    return {"before_header": header, "after_header": header, "before": before,
            "after": item["data"].decode("utf-8", "replace")}


def main():
    module = AnsibleModule(
        argument_spec={"files": {"type": "list", "elements": "dict", "required": True, "options": {
            "path": {"type": "path", "required": True},
            "content": {"type": "str", "required": True},
            "mode": {"type": "str", "required": True},
            "owner": {"type": "str", "default": "root"},
            "group": {"type": "str", "default": "root"},
        }}},
        supports_check_mode=True,
    )
    items = []
    for spec in module.params["files"]:
        missing = None if os.path.isdir(os.path.dirname(spec["path"]) or ".") else "its directory does not exist"
        try:
            item = plan(spec)
        except KeyError as error:
            item, missing = None, missing or error.args[0]
        except ValueError as error:
            module.fail_json(msg=f"{spec['path']}: {error}")
        if missing and not module.check_mode:
            module.fail_json(msg=f"{spec['path']}: {missing}")
        # Check mode: an earlier task of a real run makes the directory, user or group (a directory task, a
        # package); the file would be written.
        items.append(unplanned(spec) if missing else item)
    changed = [item for item in items if item["content"] or item["attributes"]]
    if not module.check_mode:
        for item in changed:
            try:
                write(item) if item["content"] else settle(item)
            except OSError as error:
                module.fail_json(msg=f"{item['path']}: {error}")
    result = {"changed": bool(changed), "changed_files": [item["path"] for item in changed]}
    if module._diff and changed:  # pylint: disable=protected-access
        result["diff"] = [diff(item) for item in changed]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
