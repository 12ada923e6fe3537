@testable import LabPlan

/// Every problem a plan's YAML has, as `path: message` lines (none for a valid plan).
func planProblems(_ yaml: String) -> [String] {
    do {
        _ = try Plan.parse(yaml: yaml, source: "t.yaml")
        return []
    } catch {
        return error.problems.map { "\($0.path): \($0.message)" }
    }
}
