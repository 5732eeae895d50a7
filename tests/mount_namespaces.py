"""What job_container/tmpfs's extern step does to keep each job's mount namespace (Slurm's _create_ns), by hand on
every CPU this process may run on: a namespace made on that CPU, bind-mounted from the caller's own namespace
onto a file in a private mount. Prints ``cpu<N> kept`` or ``cpu<N> refused`` for each."""

from __future__ import annotations


def keep_a_new_namespace_on_each_cpu(directory: str) -> str:
    """The sh script that does it, its scratch mount made under ``directory``."""
    return rf"""
probe=$(mktemp -d {directory}/probe.XXXXXX) && mount --bind "$probe" "$probe" && mount --make-private "$probe" && : > "$probe/ns"
for cpu in $(seq 0 $(($(nproc --all) - 1))); do
  taskset -c $cpu true 2>/dev/null || continue  # not one this process may run on
  taskset -c $cpu unshare --mount sleep 30 & child=$!
  while [ "$(readlink /proc/$child/ns/mnt)" = "$(readlink /proc/self/ns/mnt)" ]; do :; done
  if mount --bind /proc/$child/ns/mnt "$probe/ns" 2>/dev/null; then echo "cpu$cpu kept"; umount "$probe/ns"; else echo "cpu$cpu refused"; fi
  kill $child; wait $child
done
umount "$probe"; rm -r "$probe"
"""
