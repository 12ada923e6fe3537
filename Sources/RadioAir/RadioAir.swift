// RadioAir module (work in progress).
