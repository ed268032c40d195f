"""The attention-kernel lab: build, check, bench, record and publish GPU attention kernels."""
