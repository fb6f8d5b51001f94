"""The small HTTP ports that the cluster's machinery calls, served from threads and bounded in
connections and time: the operator's and the gateway's metrics pages (with the gateway's
/idle) and the operator's liveness probe. Below the operator and the gateway, which both
serve one and must not import each other."""
