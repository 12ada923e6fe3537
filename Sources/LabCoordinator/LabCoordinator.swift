// LabCoordinator module (work in progress).
