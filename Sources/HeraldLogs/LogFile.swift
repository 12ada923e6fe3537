import Foundation
import HeraldRadio
#if canImport(Glibc)
import Glibc
#endif

/// An append-only log file, buffered in memory and flushed when the buffer passes 64 KiB, at
/// least every `flushInterval` seconds of scheduler time (nil: only by size, for simulations),
/// and on `flush()` / `close()`: a crash loses seconds, not the run. Lines are built as bytes;
/// nothing on the hot path formats dates.
public final class LogFile {
    public let url: URL
    private var fd: Int32 = -1
    /// Used from one executor at a time, so without run-time exclusivity checks (a row appends often).
    @exclusivity(unchecked) private var buffer = ByteBuffer(capacity: 64 * 1024 + 1024)
    private let limit = 64 * 1024
    private var flushTask: ScheduledTask?
    public private(set) var bytesWritten: Int64 = 0
    /// The last write failure (disk full, I/O error), kept until a later write succeeds. What
    /// could not be written stays buffered (up to `retainLimit`) and is retried at each flush.
    public private(set) var writeError: String?
    /// Bytes given up after failed writes, once the buffer passed `retainLimit`.
    public private(set) var bytesDropped: Int64 = 0
    private let retainLimit = 8 << 20
    /// The size of the file on disk plus what is buffered.
    public var size: Int64 { bytesWritten + Int64(buffer.count) }
    /// The file was empty (or new) when opened.
    public let wasEmpty: Bool

    public init(url: URL, scheduler: (any Scheduler)?, flushInterval: TimeInterval? = 2) {
        self.url = url
        var folderError: String?
        do { try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true) } catch {
            folderError = error.localizedDescription
        }
        fd = open(url.path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
        if fd < 0 {
            writeError = "\(url.lastPathComponent): cannot open (\(String(cString: strerror(errno))))" + (folderError.map { "; its folder could not be made: \($0)" } ?? "")
        }
        var st = stat()
        if fd >= 0, fstat(fd, &st) == 0 { bytesWritten = Int64(st.st_size) }
        wasEmpty = bytesWritten == 0
        if let scheduler, let flushInterval {
            flushTask = scheduler.scheduleRepeating(every: flushInterval) { [weak self] in self?.flush() }
        }
    }

    deinit {
        close()
        buffer.deallocate()
    }

    public var isOpen: Bool { fd >= 0 }

    @inline(__always) public func append(_ bytes: [UInt8]) {
        buffer.append(bytes)
        if buffer.count >= limit { flush() }
    }

    @inline(__always) public func append(_ text: String) {
        buffer.append(text)
        if buffer.count >= limit { flush() }
    }

    /// Appends with a closure that writes into the buffer directly (no intermediate arrays).
    @inline(__always) public func appendLine(_ build: (inout ByteBuffer) -> Void) {
        build(&buffer)
        buffer.append(10)
        if buffer.count >= limit { flush() }
    }

    public func flush() {
        guard fd >= 0, buffer.count > 0 else { return }
        var failure: Int32 = 0
        var offset = 0
        while offset < buffer.count {
            let n = write(fd, buffer.base + offset, buffer.count - offset)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { failure = n < 0 ? errno : ENOSPC; break }
            offset += n
        }
        bytesWritten += Int64(offset)
        if failure == 0 {
            buffer.removeAll()
            writeError = nil
            return
        }
        buffer.removeFirst(offset)
        if buffer.count > retainLimit {
            bytesDropped += Int64(buffer.count)
            buffer.removeAll()
        }
        writeError = "\(url.lastPathComponent): write failed (\(String(cString: strerror(failure))))\(bytesDropped > 0 ? "; \(bytesDropped) bytes given up" : "")"
    }

    public func close() {
        flushTask?.cancel()
        flushTask = nil
        flush()
        if fd >= 0 { _ = Glibc.close(fd); fd = -1 }
    }
}

/// Where CSV bytes are built: a log file's buffer, or an array.
public protocol ByteSink {
    mutating func append(_ byte: UInt8)
    mutating func append(_ bytes: UnsafeBufferPointer<UInt8>)
}

extension Array: ByteSink where Element == UInt8 {
    @inline(__always) public mutating func append(_ bytes: UnsafeBufferPointer<UInt8>) { append(contentsOf: bytes) }
}

/// A growable byte buffer without copy-on-write or uniqueness checks: rows are built in it
/// byte by byte at the cost of a bounds check each. Owned by one `LogFile`, which frees it.
public struct ByteBuffer: ByteSink {
    private(set) var base: UnsafeMutablePointer<UInt8>
    public private(set) var count = 0
    private(set) var capacity: Int

    init(capacity: Int) {
        self.capacity = max(16, capacity)
        base = .allocate(capacity: self.capacity)
    }

    func deallocate() { base.deallocate() }

    @inline(__always) mutating func reserve(_ n: Int) {
        if count + n > capacity { grow(count + n) }
    }

    @inline(never) private mutating func grow(_ needed: Int) {
        let bigger = max(needed, capacity * 2)
        let b = UnsafeMutablePointer<UInt8>.allocate(capacity: bigger)
        b.update(from: base, count: count)
        base.deallocate()
        base = b
        capacity = bigger
    }

    @inline(__always) public mutating func append(_ byte: UInt8) {
        if count == capacity { grow(count + 1) }
        base[count] = byte
        count += 1
    }

    @inline(__always) public mutating func append(_ bytes: UnsafeBufferPointer<UInt8>) {
        guard let src = bytes.baseAddress, bytes.count > 0 else { return }
        reserve(bytes.count)
        (base + count).update(from: src, count: bytes.count)
        count += bytes.count
    }

    @inline(__always) mutating func append(_ bytes: [UInt8]) {
        bytes.withUnsafeBufferPointer { append($0) }
    }

    @inline(__always) mutating func append(_ text: String) {
        var t = text
        t.withUTF8 { append($0) }
    }

    mutating func removeAll() { count = 0 }

    mutating func removeFirst(_ n: Int) {
        let n = min(n, count)
        guard n > 0 else { return }
        base.update(from: base + n, count: count - n)
        count -= n
    }
}

/// Writes a whole small file atomically (temporary file + rename), so a crash never leaves it
/// empty or half written.
enum AtomicFile {
    /// Returns what went wrong, or nil; the previous content stays whole on failure. `durable`
    /// (live nodes) also syncs the data to disk before the rename; a simulation's files are
    /// written without (like its appended logs), which saves a disk flush per file.
    @discardableResult
    static func write(_ text: String, to url: URL, durable: Bool = true) -> String? {
        try? FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        let tmp = url.deletingLastPathComponent().appendingPathComponent(".\(url.lastPathComponent).tmp")
        if !durable { return writeQuickly(text, tmp: tmp, to: url) }
        do {
            try Data(text.utf8).write(to: tmp)
            guard rename(tmp.path, url.path) == 0 else { return "\(url.lastPathComponent): cannot rename (\(String(cString: strerror(errno))))" }
            return nil
        } catch {
            try? FileManager.default.removeItem(at: tmp)
            return "\(url.lastPathComponent): write failed (\(error.localizedDescription))"
        }
    }
}

extension AtomicFile {
    private static func writeQuickly(_ text: String, tmp: URL, to url: URL) -> String? {
        let fd = open(tmp.path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { return "\(url.lastPathComponent): write failed (\(String(cString: strerror(errno))))" }
        var t = text
        let failure: Int32 = t.withUTF8 { u in
            var offset = 0
            while offset < u.count {
                let n = Glibc.write(fd, u.baseAddress! + offset, u.count - offset)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { return n < 0 ? errno : ENOSPC }
                offset += n
            }
            return 0
        }
        _ = Glibc.close(fd)
        if failure != 0 {
            unlink(tmp.path)
            return "\(url.lastPathComponent): write failed (\(String(cString: strerror(failure))))"
        }
        guard rename(tmp.path, url.path) == 0 else { return "\(url.lastPathComponent): cannot rename (\(String(cString: strerror(errno))))" }
        return nil
    }
}

/// Byte-level helpers for building CSV lines.
enum Bytes {
    /// Herald's CSV rule: wrap in double quotes if the value contains `,` `"` `'` or `’`;
    /// inner quotes are not escaped.
    static func appendCSV<S: ByteSink>(_ value: String, to out: inout S) {
        var v = value
        v.withUTF8 { u in
            var needs = false
            var i = 0
            while i < u.count {
                let c = u[i]
                if c == 44 || c == 34 || c == 39 { needs = true; break }
                // ’ is E2 80 99
                if c == 0xE2, i + 2 < u.count, u[i + 1] == 0x80, u[i + 2] == 0x99 { needs = true; break }
                i += 1
            }
            if needs { out.append(34) }
            out.append(u)
            if needs { out.append(34) }
        }
    }

    static func appendRaw<S: ByteSink>(_ value: String, to out: inout S) {
        var v = value
        v.withUTF8 { out.append($0) }
    }
}
