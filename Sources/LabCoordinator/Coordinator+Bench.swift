import Foundation
import LabHTTP
import LabPlan

/// The one benchmark hook left in the coordinator: `herald-lab bench gather` times the real
/// gathering code (`gatherNode`: download, SHA-256, fsync) on a finished run an agent holds.
/// Moving it out would need either `gatherNode` public, or the benchmark to drive a real run
/// through the HTTP API up to its gathering (a run record the coordinator resumes), which a
/// coordinator only has for runs it armed itself.
extension Coordinator {
    /// Gathers one node's files from an agent into `dir`, verifying every checksum, as a run's
    /// gather does; returns the bytes fetched (benchmarks).
    public func fetchFiles(agentURL: String, runId: String, node: String, into dir: URL) async throws -> Int64 {
        let n = RunRecord.Node(name: node, agent: node, agentURL: agentURL, state: .finished, files: [])
        let (list, _, failure) = await runs.gatherNode(runId, n, chosenAt: now, into: dir)
        guard let list else { throw LabClient.Failure(status: nil, message: failure?.message ?? "gather failed") }
        return list.files.reduce(0) { $0 + $1.bytes }
    }
}
