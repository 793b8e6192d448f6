module dsv4-operator/bench/probes/native_relay

go 1.26
