# One round of the Slurm exporter's collector (components/programs/slurm_exporter.py reads the files).
# Usage: sh collect_slurm_state.sh DIR
# Each command's output replaces its file only when the command succeeded, by rename, so the exporter
# never reads half a file, and a controller that stops answering leaves the files ageing.
# squeue lists the jobs not yet finished, array tasks one by one (-r), in hidden partitions too (-a).
dir="$1"
collect() {
    name="$1"; shift
    if "$@" > "$dir/.$name" 2> "$dir/.$name.err"; then
        mv "$dir/.$name" "$dir/$name"
    else
        echo "$name: $* failed: $(cat "$dir/.$name.err")" >&2
    fi
}
collect nodes scontrol --oneliner show node
collect jobs squeue --noheader --all --array '--format=%i|%T|%P|%u|%N'
collect sdiag sdiag
