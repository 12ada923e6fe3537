/// What `herald-lab --version` prints and every manifest records: the release and the commit the
/// binary was built from (BuildInfoPlugin writes the commit at build time).
public enum BuildInfo {
    public static let version = "0.2.0"
    /// The short git commit, "-dirty" when built with uncommitted changes, or "unknown".
    public static var commit: String { generatedBuildCommit }
    /// "herald-lab 0.2.0 (commit 1a2b3c4d5e6f)".
    public static var line: String { "herald-lab \(version) (commit \(commit))" }
}
