import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Writes that are on disk before anyone is told they are: a file's bytes and its directory
/// entry are fsynced. Every piece of state that decides whether data may be deleted (an agent's
/// assignment and run state, a gathered file, a manifest) goes through here.
public enum Durable {
    public struct Failure: Error, CustomStringConvertible, Sendable {
        public var path: String
        public var problem: String
        public var description: String { "\(path): \(problem)" }
    }

    /// Refuses a folder HeraldLab derives inside an output folder (a study's, a run's) when a
    /// symbolic link stands there: whatever placed it would have the outputs written where it
    /// points (issue 36). A folder that is not there yet, or is a real folder, is fine.
    public static func refuseLink(_ url: URL) throws {
        var st = stat()
        guard lstat(url.path, &st) == 0 else { return }
        if (st.st_mode & S_IFMT) == S_IFLNK {
            throw Failure(path: url.path, problem: "is a symbolic link in the output folder; HeraldLab writes only into folders of its own (remove it or give another --out)")
        }
    }

    /// Replaces `url` with `data` atomically (temporary file, fsync, rename, fsync of the folder).
    /// `mode`: the file's permissions (0600 for secrets: set before a byte is written).
    public static func write(_ data: Data, to url: URL, mode: mode_t = 0o644) throws {
        let dir = url.deletingLastPathComponent()
        let tmp = dir.appendingPathComponent(".\(url.lastPathComponent).tmp")
        unlink(tmp.path)
        let fd = open(tmp.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode)
        guard fd >= 0 else { throw failure(tmp, "cannot create") }
        do {
            guard fchmod(fd, mode) == 0 else { throw failure(tmp, "cannot set its mode") }
            try data.withUnsafeBytes { raw in
                var off = 0
                while off < raw.count {
                    let n = Glibc.write(fd, raw.baseAddress! + off, raw.count - off)
                    if n < 0 { if errno == EINTR { continue }; throw failure(tmp, "cannot write") }
                    off += n
                }
            }
            guard fsync(fd) == 0 else { throw failure(tmp, "cannot fsync") }
        } catch {
            close(fd)
            unlink(tmp.path)
            throw error
        }
        close(fd)
        guard rename(tmp.path, url.path) == 0 else {
            let e = failure(url, "cannot rename into place")
            unlink(tmp.path)
            throw e
        }
        try syncDirectory(dir)
    }

    /// fsyncs a file already written.
    public static func syncFile(_ url: URL) throws {
        let fd = open(url.path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw failure(url, "cannot open to fsync") }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw failure(url, "cannot fsync") }
    }

    /// fsyncs a folder, so the names created or renamed in it survive a power cut.
    public static func syncDirectory(_ url: URL) throws {
        let fd = open(url.path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw failure(url, "cannot open the folder to fsync") }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw failure(url, "cannot fsync the folder") }
    }

    static func failure(_ url: URL, _ what: String) -> Failure {
        Failure(path: url.path, problem: "\(what) (\(String(cString: strerror(errno))))")
    }
}
