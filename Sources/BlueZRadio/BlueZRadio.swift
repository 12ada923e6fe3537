// BlueZRadio module (work in progress).
