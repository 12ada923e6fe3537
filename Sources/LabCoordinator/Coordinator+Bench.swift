import Foundation
import LabHTTP
import LabPlan

extension Coordinator {
    /// The state of a run (benchmarks and tests).
    public func state(of id: String) -> RunRecord.State? { run(id)?.state }

    /// Gathers one node's files from an agent into `dir`, verifying every checksum, as a run's
    /// gather does; returns the bytes fetched (benchmarks).
    public func fetchFiles(agentURL: String, runId: String, node: String, into dir: URL) async throws -> Int64 {
        let n = RunRecord.Node(name: node, agent: node, agentURL: agentURL, state: "finished", files: [])
        let (list, _, error) = await gatherNode(runId, n, into: dir)
        guard let list else { throw LabClient.Failure(status: nil, message: error ?? "gather failed") }
        return list.files.reduce(0) { $0 + $1.bytes }
    }
}
