import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Opens log files, manifests and summaries safely: only regular files are read, never a FIFO
/// (opening one blocks), a device (`/dev/zero` never ends), a socket or a directory. A symbolic
/// link is followed only if it resolves to a regular file inside `root` (the folder being
/// analysed); a link leading outside it is refused, so that a bundle cannot make the analyser
/// read arbitrary files. Files are opened non-blocking and checked with `fstat` on the opened
/// descriptor, so a file swapped after the check is still caught.
public enum LogFileAccess {
    public enum Problem: Error, CustomStringConvertible, Equatable {
        case missing(String)
        case notRegular(String, kind: String)
        case linkOutside(String, target: String)
        case tooLarge(String, limit: Int64)
        case unreadable(String, reason: String)

        public var description: String {
            switch self {
            case .missing(let name): return "\(name) is missing"
            case .notRegular(let name, let kind): return "\(name) is \(kind), not a regular file: not read"
            case .linkOutside(let name, let target): return "\(name) leads to \(target), outside the analysed folder: not followed"
            case .tooLarge(let name, let limit): return "\(name) is larger than \(limit) bytes: not read"
            case .unreadable(let name, let reason): return "\(name) cannot be read: \(reason)"
            }
        }
    }

    static func kindName(_ mode: mode_t) -> String {
        switch mode & S_IFMT {
        case S_IFDIR: return "a directory"
        case S_IFIFO: return "a FIFO"
        case S_IFCHR: return "a character device"
        case S_IFBLK: return "a block device"
        case S_IFSOCK: return "a socket"
        case S_IFLNK: return "a symbolic link"
        default: return "not a regular file"
        }
    }

    /// The real path of `url` after the checks above; throws a `Problem` naming the file.
    /// Every symbolic link on the way (the file's own or a folder's) must stay inside `root`
    /// (default: the file's folder).
    static func resolve(_ url: URL, root: URL?, name: String) throws -> String {
        var st = stat()
        guard lstat(url.path, &st) == 0 else { throw Problem.missing(name) }
        let isLink = st.st_mode & S_IFMT == S_IFLNK
        guard let resolved = realpath(url.path, nil) else {
            throw isLink ? Problem.missing("\(name) (a symbolic link to nothing)") : Problem.missing(name)
        }
        let target = String(cString: resolved)
        free(resolved)
        let base = root ?? url.deletingLastPathComponent()
        guard let rootReal = realpath(base.path, nil) else { throw Problem.linkOutside(name, target: target) }
        let rootPath = String(cString: rootReal)
        free(rootReal)
        let prefix = rootPath.hasSuffix("/") ? rootPath : rootPath + "/"
        guard target.hasPrefix(prefix) else { throw Problem.linkOutside(name, target: target) }
        var tst = stat()
        guard stat(target, &tst) == 0 else { throw Problem.missing(name) }
        guard tst.st_mode & S_IFMT == S_IFREG else {
            throw Problem.notRegular(name, kind: (isLink ? "a symbolic link to " : "") + kindName(tst.st_mode))
        }
        return target
    }

    /// Size of a readable regular file, or the problem with it.
    public static func size(_ url: URL, root: URL? = nil) throws -> Int64 {
        let name = url.lastPathComponent
        let path = try resolve(url, root: root, name: name)
        var st = stat()
        guard stat(path, &st) == 0 else { throw Problem.missing(name) }
        return Int64(st.st_size)
    }

    /// Opens a regular file for reading (see the type's comment).
    public static func open(_ url: URL, root: URL? = nil) throws -> FileHandle {
        let name = url.lastPathComponent
        let path = try resolve(url, root: root, name: name)
        let fd = Glibc.open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else { throw Problem.unreadable(name, reason: String(cString: strerror(errno))) }
        var st = stat()
        guard fstat(fd, &st) == 0, st.st_mode & S_IFMT == S_IFREG else {
            let kind = kindName(st.st_mode)
            close(fd)
            throw Problem.notRegular(name, kind: kind)
        }
        return FileHandle(fileDescriptor: fd, closeOnDealloc: true)
    }

    /// Reads a whole small regular file (a manifest, a summary), refusing one over `limit` bytes.
    public static func read(_ url: URL, root: URL? = nil, limit: Int64 = 64 << 20) throws -> Data {
        let handle = try open(url, root: root)
        defer { try? handle.close() }
        var data = Data()
        while let chunk = try handle.read(upToCount: 1 << 20), !chunk.isEmpty {
            data.append(chunk)
            if Int64(data.count) > limit { throw Problem.tooLarge(url.lastPathComponent, limit: limit) }
        }
        return data
    }
}
