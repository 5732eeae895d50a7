"""Keeps a fresh Slurm token in a file for the sbatch container beside it (a native sidecar).

It trades the pod's projected ServiceAccount token for a Slurm JWT at the minter, writes it
atomically to TOKEN_FILE (memory-backed, this pod only) and renews it at a third of its
lifetime, so a job that runs for days is still watched with a valid token. A refusal (403)
is final: the pod's ServiceAccount is not mapped, and the error says so.

Run: ``python3 token_fetcher.py`` with FETCHER_MINTER_URL, FETCHER_SA_TOKEN_FILE, FETCHER_TOKEN_FILE.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request

RETRY_SECONDS = 5


def fetch(minter_url: str, sa_token_file: str) -> dict:
    with open(sa_token_file) as sa_token:  # the kubelet renews it: read it each time
        bearer = sa_token.read().strip()
    request = urllib.request.Request(minter_url, data=b"", headers={"Authorization": f"Bearer {bearer}"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def write_atomically(path: str, text: str) -> None:
    temporary = f"{path}.new"
    with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write(text)
    os.replace(temporary, path)


def main() -> None:
    env = os.environ
    while True:
        try:
            answer = fetch(env["FETCHER_MINTER_URL"], env["FETCHER_SA_TOKEN_FILE"])
        except urllib.error.HTTPError as error:
            reason = error.read().decode(errors="replace")
            print(f"token fetcher: the minter refused ({error.code}): {reason}", file=sys.stderr, flush=True)
            if error.code in (401, 403):
                sys.exit(1)
            time.sleep(RETRY_SECONDS)
            continue
        except (OSError, ValueError) as error:
            print(f"token fetcher: minter unreachable: {error}", file=sys.stderr, flush=True)
            time.sleep(RETRY_SECONDS)
            continue
        write_atomically(env["FETCHER_TOKEN_FILE"], answer["token"])
        print(f"token fetcher: token for {answer['user']}, valid {answer['expires_in']}s", file=sys.stderr, flush=True)
        time.sleep(max(RETRY_SECONDS, answer["expires_in"] // 3))


if __name__ == "__main__":
    main()
