"""The package's own namespace: names imported on first use."""
import subprocess
import sys


def test_dir_lists_each_public_name_once_and_every_one_resolves():
    # a fresh interpreter: the names start unimported, then `import *` puts them in the module's globals
    code = ("import normlab; before = dir(normlab); from normlab import *; after = dir(normlab); "
            "assert len(after) == len(set(after)), [n for n in set(after) if after.count(n) > 1]; "
            "assert set(normlab.__all__) <= set(before) <= set(after); "
            "[getattr(normlab, n) for n in normlab.__all__]")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_artifact_names_the_source_it_came_from():
    """Outside a git checkout (an installed wheel) the commit is None and the version string stays the same from
    build to build: the record also holds a digest of normlab's own source files."""
    import re

    from normlab.provenance import code_digest, record

    rec = record()
    assert re.fullmatch(r"[0-9a-f]{16}", rec["source_digest"]) and rec["source_digest"] == code_digest()
