// LabHistory module (work in progress).
