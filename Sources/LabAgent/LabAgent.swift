// LabAgent module (work in progress).
