// LabHTTP module (work in progress).
