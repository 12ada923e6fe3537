// DBus module (work in progress).
