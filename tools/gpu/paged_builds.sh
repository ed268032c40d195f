#!/bin/bash
# Sourced by tools/gpu/paged_session.sh and paged_dims_call.sh: paged_builds LOG STEPS builds the binding and every
# decode kernel of the registry (and its paged versions with LAB_PAGED_BUG_IDENTITY, the self-test's wrong kernel) at once, into
# $LAB_CACHE_DIR, appending nvcc's output to LOG and "builds N s" to STEPS.
paged_builds() {
  local t0; t0=$(date +%s)
  python3 -c "from lab import build; build.binding()" > "$1" 2>&1 &
  for v in $(python3 -c "from lab import registry; print(*registry.DECODE)"); do
    python3 -c "from lab import build, registry; build.build_kernel(registry.DECODE['$v'].source)" >> "$1" 2>&1 &
  done
  for v in $(python3 -c "from lab import registry; print(*registry.PAGED_DECODE)"); do
    python3 -c "from lab import build, registry; build.build_kernel(registry.DECODE['$v'].source, {'LAB_PAGED_BUG_IDENTITY': None})" \
      >> "$1" 2>&1 &
  done
  wait
  echo "builds $(( $(date +%s) - t0 )) s" >> "$2"
}
