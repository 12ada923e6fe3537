// LabNode module (work in progress).
