// RadioSim module (work in progress).
