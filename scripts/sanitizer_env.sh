# Sourced by sanitize.sh and fuzz.sh: the sanitizer runtimes' options, where the caller has not set
# its own. protect_shadow_gap=0: the CUDA runtime maps memory where ASan's shadow gap would be.
export ASAN_OPTIONS=${ASAN_OPTIONS:-protect_shadow_gap=0:detect_leaks=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1}
