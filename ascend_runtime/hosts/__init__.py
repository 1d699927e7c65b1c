"""Host preparation over SSH: a strict paramiko runner, output parsers and declarative playbooks.

Modules:
- :mod:`.quoting`   renders command templates, shell-quoting every interpolated value;
- :mod:`.ssh`       connects (strict known_hosts, optional jump host, retries) and runs commands;
- :mod:`.parsers`   tolerant parsers for ``npu-smi`` / ``hccn_tool`` / version files;
- :mod:`.playbook`  the playbook file model (``playbooks/*.yaml``);
- :mod:`.engine`    runs a playbook over hosts in a bounded pool and evaluates steps;
- :mod:`.facts`     merges collected facts into the inventory file, byte-stable;
- :mod:`.stackref`  reads the stack keys the playbooks need.
"""
