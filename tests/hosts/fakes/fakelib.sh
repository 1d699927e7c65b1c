# Shared helpers of the fake npu-smi / hccn_tool / ip (POSIX sh, sourced).
# State: the flat JSON object in $FAKE_NPU_STATE, one "key": "value" per line
# (json.dumps(state, indent=0, sort_keys=True)), e.g. "dev.3.link": "UP".
# Every invocation is appended to $FAKE_NPU_STATE.log (one line each).
STATE="${FAKE_NPU_STATE:?FAKE_NPU_STATE is not set}"
printf '%s %s\n' "$(basename "$0")" "$(printf '%s' "$*" | tr '\n' ' ')" >> "$STATE.log"

get() {  # get KEY -> value (empty when absent)
    sed -n "s/^\"$1\": \"\(.*\)\",\{0,1\}\$/\1/p" "$STATE"
}

put() {  # put KEY VALUE (the key must exist)
    sed -i "s/^\"$1\": \".*\"\(,\{0,1\}\)\$/\"$1\": \"$2\"\1/" "$STATE"
}

present() {  # present DEV -> status 0 when the device exists
    [ "$(get "dev.$1.present")" = "1" ]
}

ndev() { get ndev; }

privileged() {  # status 0 when running as (fake) root: no "uid" in the state, uid 0, or under the fake sudo
    uid=$(get uid)
    [ -z "$uid" ] || [ "$uid" = 0 ] || [ "${FAKE_SUDO:-}" = 1 ]
}

hang_if_asked() {  # hang_if_asked "OP MODE": when the state's "hang" is exactly that, hang (pids -> $STATE.hang)
    h=$(get hang)
    if [ -n "$h" ] && [ "$h" = "$1" ]; then
        sleep 300 &
        printf '%s %s\n' "$$" "$!" >> "$STATE.hang"
        wait
        exit 1
    fi
}

write_hccn_conf() {
    conf=$(get hccn_conf)
    : > "$conf"
    d=0
    while [ "$d" -lt "$(ndev)" ]; do
        for k in address:ip netmask:netmask netdetect:netdetect gateway:gateway tls_enable:tls; do
            v=$(get "dev.$d.${k#*:}")
            [ -n "$v" ] && printf '%s_%s=%s\n' "${k%%:*}" "$d" "$v" >> "$conf"
        done
        d=$((d + 1))
    done
}
