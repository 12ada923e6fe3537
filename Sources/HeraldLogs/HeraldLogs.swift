// HeraldLogs module (work in progress).
