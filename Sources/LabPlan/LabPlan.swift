// LabPlan module (work in progress).
