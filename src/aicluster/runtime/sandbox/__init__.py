"""The tenant sandbox: bubblewrap, the seccomp filter, cgroups, per-job disks, sealed job secrets,
and the shims a rank's process passes through."""
