import Foundation
import HeraldCore
import LabNet
import CLinuxEvents
#if canImport(Glibc)
import Glibc
#endif

/// Streams an HTTP GET body straight into a file while hashing it: no body is held in memory,
/// and the checksum is ready when the last byte lands. Used to gather logs (about a gigabyte a
/// second on loopback, where URLSession on Linux manages a tenth of that).
///
/// The body is received into a ring of 1 MiB buffers, each filled completely before it is
/// handed on, so that every chunk but the first and the last covers whole pages of the file.
/// Two consumers take each chunk at once, each on its own thread: the hasher (in order) and the
/// writer (at the chunk's offset); a buffer is received into again once both are done with it.
/// The writer sends whole pages straight to the disk (O_DIRECT: no copy into the page cache,
/// and nothing left for the final fsync to write back) and what is not whole pages (the start
/// of a resumed download in the middle of a page, the end of the body) through the page cache;
/// where the file system refuses O_DIRECT everything goes through the page cache.
public enum FileDownload {
    public struct Result: Sendable {
        public var status: Int
        /// Bytes written by this request.
        public var bytes: Int64
        /// Whether whole pages went to the disk directly (O_DIRECT); false when the file system
        /// refused it, and every byte went through the page cache.
        public var direct: Bool
    }

    /// How the body is written.
    enum WriteMode: Sendable {
        /// Whole pages with O_DIRECT where the file system takes it, through the page cache otherwise.
        case direct
        /// Everything through the page cache.
        case buffered
        /// Tests: O_DIRECT is opened, and its first write is refused (EINVAL), as by a file
        /// system that takes the flag at open but not the write.
        case directRefusedAtFirstWrite
    }

    /// GETs `url` (http only) with `headers`; on 200 the file is truncated first, on 206 the body is
    /// appended. Every written byte is fed to `hasher` in order. Throws when the body ends before
    /// its Content-Length or a write fails; the file then holds the body's start, in order (a
    /// download can resume from its size).
    public static func get(_ url: URL, headers: [String: String], appendingTo file: URL, hasher: inout SHA256, timeout: TimeInterval = 60) throws -> Result {
        try get(url, headers: headers, appendingTo: file, hasher: &hasher, timeout: timeout, mode: .direct)
    }

    static func get(_ url: URL, headers: [String: String], appendingTo file: URL, hasher: inout SHA256, timeout: TimeInterval = 60,
                    mode: WriteMode) throws -> Result {
        let target: HostPort
        let fd: Connection
        do {
            target = try HostPort(url: url)
            fd = try Connection.dial(url: url, timeout: timeout)
        } catch let e as NetError {
            throw LabClient.Failure(status: nil, message: "download of \(url.absoluteString): \(e.message)")
        }
        defer { fd.close() }
        fd.setTimeouts(seconds: timeout)
        func failure(_ e: Error) -> LabClient.Failure {
            LabClient.Failure(status: nil, message: "download of \(url.absoluteString): \((e as? NetError)?.message ?? "\(e)")")
        }
        let components = URLComponents(url: url, resolvingAgainstBaseURL: true)
        var path = components?.percentEncodedPath ?? "/"
        if path.isEmpty { path = "/" }
        if let q = components?.percentEncodedQuery { path += "?" + q }
        var request = "GET \(path) HTTP/1.1\r\nHost: \(target)\r\nConnection: close\r\n"
        for (k, v) in headers { request += "\(k): \(v)\r\n" }
        request += "\r\n"
        do { try fd.write(request) } catch { throw failure(error) }

        // Read the head (and perhaps the body's start).
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        var head = [UInt8]()
        var bodyStart = 0
        var filled = 0
        while true {
            let n: Int
            do { n = try fd.read(into: &buffer, from: filled) } catch { throw failure(error) }
            guard n > 0 else { throw LabClient.Failure(status: nil, message: "connection closed before the response head") }
            filled += n
            if let end = find(buffer, filled, [13, 10, 13, 10]) {
                head = Array(buffer[0..<end])
                bodyStart = end + 4
                break
            }
            guard filled < buffer.count else { throw LabClient.Failure(status: nil, message: "response head too large") }
        }
        let lines = String(decoding: head, as: UTF8.self).components(separatedBy: "\r\n")
        let parts = lines.first?.split(separator: " ") ?? []
        guard parts.count >= 2, let status = Int(parts[1]) else { throw LabClient.Failure(status: nil, message: "bad status line") }
        var length: Int64?
        for l in lines.dropFirst() {
            let kv = l.split(separator: ":", maxSplits: 1)
            guard kv.count == 2 else { continue }
            let k = kv[0].trimmingCharacters(in: .whitespaces).lowercased(), v = kv[1].trimmingCharacters(in: .whitespaces)
            if k == "content-length" {
                guard let n = Int64(v), n >= 0 else { throw LabClient.Failure(status: status, message: "bad Content-Length \"\(v.prefix(40))\"") }
                length = n
            }
            if k == "transfer-encoding", v.lowercased().contains("chunked") { throw LabClient.Failure(status: status, message: "chunked downloads are not supported") }
        }
        guard status == 200 || status == 206 else {
            throw LabClient.Failure(status: status, message: String(decoding: buffer[bodyStart..<filled], as: UTF8.self))
        }
        let sink: FileSink
        do { sink = try FileSink(file, truncate: status == 200, mode: mode) } catch { throw failure(error) }
        let pipeline = Pipeline(hasher, sink)
        var outcome: Pipeline.Outcome?
        // On every way out, the consumers finish with the ring before it goes.
        defer { if outcome == nil { hasher = pipeline.finish().hasher } }

        var leftover = bodyStart..<filled // body bytes that came with the head
        var received: Int64 = 0
        var offset = sink.start
        var ended = false
        while !ended && length.map({ received < $0 }) ?? true {
            if let e = pipeline.writeError { throw failure(e) }
            let slot = pipeline.acquire()
            // The first chunk starts as far into its buffer as its offset is into a page: the
            // page boundaries of the file then fall on page boundaries of the buffers.
            let lead = Int(offset % Int64(Pipeline.page))
            var want = Pipeline.slotSize - lead
            if let length { want = Int(min(Int64(want), length - received)) }
            let data = slot + lead
            var got = 0
            if !leftover.isEmpty {
                let k = min(leftover.count, want)
                buffer.withUnsafeBytes { data.copyMemory(from: $0.baseAddress! + leftover.lowerBound, byteCount: k) }
                leftover = (leftover.lowerBound + k)..<leftover.upperBound
                got = k
            }
            var readError: Error?
            while got < want {
                do {
                    let n = try fd.read(into: UnsafeMutableRawBufferPointer(start: data + got, count: want - got))
                    if n == 0 { ended = true; break }
                    got += n
                } catch {
                    readError = error
                    break
                }
            }
            // What arrived is written even when the stream broke: a retry resumes after it.
            if got > 0 { pipeline.submit(slot, data: data, count: got, at: offset) } else { pipeline.release(slot) }
            offset += Int64(got)
            received += Int64(got)
            if let readError { throw failure(readError) }
        }
        let o = pipeline.finish()
        outcome = o
        hasher = o.hasher
        if let e = o.writeError { throw failure(e) }
        if let length, o.written != length {
            throw LabClient.Failure(status: status, message: "connection closed after \(o.written) of \(length) bytes")
        }
        guard o.written == received else {
            throw LabClient.Failure(status: status, message: "\(o.written) of the \(received) bytes received were written")
        }
        return Result(status: status, bytes: o.written, direct: o.direct)
    }

    /// The file a body goes to: a descriptor through the page cache, and one with O_DIRECT for
    /// whole pages while the file system takes it. Used by the writer's thread only.
    final class FileSink: @unchecked Sendable {
        static let page = 4096
        let path: String
        /// Where the body starts: 0, or the file's size for a resumed download.
        let start: Int64
        private let fd: Int32
        private var directFD: Int32?
        private var refuseNextDirectWrite: Bool
        /// Bytes written, all of them in order from `start`.
        private(set) var written: Int64 = 0
        /// Write-back of what went through the page cache is started as it grows (without
        /// waiting), so that the final fsync finds little left to write.
        private var writebackFrom: Int64
        private var unflushed = 0

        init(_ url: URL, truncate: Bool, mode: WriteMode) throws {
            path = url.path
            fd = open(path, O_WRONLY | O_CLOEXEC)
            guard fd >= 0 else { throw Self.error("cannot open \(url.path) for writing", errno) }
            var end: Int64 = 0
            if truncate {
                guard ftruncate(fd, 0) == 0 else { let e = errno; close(fd); throw Self.error("cannot truncate \(url.path)", e) }
            } else {
                end = Int64(lseek(fd, 0, SEEK_END))
                guard end >= 0 else { let e = errno; close(fd); throw Self.error("cannot seek in \(url.path)", e) }
            }
            start = end
            writebackFrom = end
            refuseNextDirectWrite = mode == .directRefusedAtFirstWrite
            if mode != .buffered {
                // A file system without O_DIRECT (EINVAL) gets every byte through the page cache.
                let d = open(path, O_WRONLY | O_CLOEXEC | heraldlab_o_direct())
                directFD = d >= 0 ? d : nil
            }
        }

        deinit {
            close(fd)
            if let directFD { close(directFD) }
        }

        var direct: Bool { directFD != nil }

        static func error(_ what: String, _ e: Int32) -> Error {
            LabClient.Failure(status: nil, message: "\(what): \(NetError.text(errno: e))")
        }

        /// Writes chunks that follow one another in the file (in order): the whole pages of
        /// each go direct, several chunks in one call; the rest through the page cache.
        func write(_ chunks: [(data: UnsafeRawPointer, count: Int, offset: Int64)]) throws {
            var run = [iovec]()
            var runOffset: Int64 = 0
            var runBytes = 0
            func flush() throws {
                guard !run.isEmpty else { return }
                try writeDirect(run, at: runOffset, bytes: runBytes)
                run.removeAll(keepingCapacity: true)
                runBytes = 0
            }
            for c in chunks {
                var p = c.data, n = c.count, o = c.offset
                if directFD != nil {
                    // Up to the next page boundary (a resumed download's start): the page cache.
                    let head = min(n, (Self.page - Int(o % Int64(Self.page))) % Self.page)
                    if head > 0 {
                        try flush()
                        try writeBuffered(p, head, at: o)
                        (p, n, o) = (p + head, n - head, o + Int64(head))
                    }
                    let whole = n / Self.page * Self.page
                    if whole > 0 {
                        if runOffset + Int64(runBytes) != o { try flush() }
                        if run.isEmpty { runOffset = o }
                        run.append(iovec(iov_base: UnsafeMutableRawPointer(mutating: p), iov_len: whole))
                        runBytes += whole
                        (p, n, o) = (p + whole, n - whole, o + Int64(whole))
                    }
                }
                if n > 0 {
                    try flush()
                    try writeBuffered(p, n, at: o)
                }
            }
            try flush()
        }

        private func writeDirect(_ pieces: [iovec], at offset: Int64, bytes: Int) throws {
            var iov = pieces
            var first = 0
            var at = offset
            var left = bytes
            while left > 0 {
                guard let d = directFD else {
                    // O_DIRECT refused: what is left goes through the page cache.
                    for v in iov[first...] where v.iov_len > 0 {
                        try writeBuffered(UnsafeRawPointer(v.iov_base!), v.iov_len, at: at)
                        at += Int64(v.iov_len)
                    }
                    return
                }
                var n: Int
                if refuseNextDirectWrite {
                    refuseNextDirectWrite = false
                    n = -1
                    errno = EINVAL
                } else {
                    n = iov.withUnsafeBufferPointer { pwritev(d, $0.baseAddress! + first, Int32(min(iov.count - first, 1024)) /* IOV_MAX */, off_t(at)) }
                }
                if n < 0 {
                    let e = errno
                    if e == EINTR { continue }
                    if e == EINVAL {
                        // The file system takes the flag but not the write (alignment it wants
                        // larger than a page): the page cache from here on.
                        close(d)
                        directFD = nil
                        continue
                    }
                    throw Self.error("writing \(path) failed", e)
                }
                guard n > 0 else { throw Self.error("writing \(path) failed", EIO) }
                written += Int64(n)
                at += Int64(n)
                left -= n
                while n > 0 {
                    let take = min(n, iov[first].iov_len)
                    iov[first].iov_base = iov[first].iov_base! + take
                    iov[first].iov_len -= take
                    n -= take
                    if iov[first].iov_len == 0 { first += 1 }
                }
            }
        }

        private func writeBuffered(_ p: UnsafeRawPointer, _ count: Int, at offset: Int64) throws {
            var done = 0
            while done < count {
                let n = pwrite(fd, p + done, count - done, off_t(offset + Int64(done)))
                if n < 0 {
                    if errno == EINTR { continue }
                    throw Self.error("writing \(path) failed", errno)
                }
                guard n > 0 else { throw Self.error("writing \(path) failed", EIO) }
                done += n
                written += Int64(n)
            }
            unflushed += count
            let end = offset + Int64(count)
            if unflushed >= 8 << 20 {
                _ = heraldlab_start_writeback(fd, writebackFrom, end - writebackFrom)
                writebackFrom = end
                unflushed = 0
            }
        }
    }

    /// The ring of buffers between the socket and the two consumers (hasher and writer, each a
    /// thread of its own): `acquire` waits until a buffer is free, `submit` hands a filled one
    /// to both, and the second of them to be done frees it.
    final class Pipeline: @unchecked Sendable {
        static let slotSize = 1 << 20
        static let slots = 16
        static let page = FileSink.page
        /// Direct writes of several chunks in one call, up to this many bytes.
        static let maxWrite = 4 << 20

        struct Outcome {
            var hasher: SHA256
            var written: Int64
            var writeError: Error?
            var direct: Bool
        }

        private struct Chunk: @unchecked Sendable {
            var slot: Int
            var data: UnsafeRawPointer
            var count: Int
            var offset: Int64
        }

        private let memory: UnsafeMutableRawPointer
        private let free = DispatchSemaphore(value: Pipeline.slots)
        private let lock = NSLock()
        private var freeSlots: [Int]
        /// Consumers still using each slot (0, 1 or 2).
        private var users: [Int]
        private var hasher: SHA256
        private let sink: FileSink
        private var error: Error?
        private var hashing: Consumer<Chunk>!
        private var writing: Consumer<Chunk>!
        private var outcome: Outcome?

        init(_ hasher: SHA256, _ sink: FileSink) {
            self.hasher = hasher
            self.sink = sink
            // Huge pages where the system gives them (THP): a few faults instead of thousands,
            // and cheaper pinning of the buffers for direct writes.
            memory = UnsafeMutableRawPointer.allocate(byteCount: Self.slots * Self.slotSize, alignment: 2 << 20)
            _ = madvise(memory, Self.slots * Self.slotSize, MADV_HUGEPAGE)
            freeSlots = Array((0..<Self.slots).reversed())
            users = Array(repeating: 0, count: Self.slots)
            hashing = Consumer(name: "herald.dl.hash", batch: Self.slots) { [unowned self] chunks in
                for c in chunks {
                    self.hasher.update(UnsafeRawBufferPointer(start: c.data, count: c.count))
                    self.done(c.slot)
                }
            }
            writing = Consumer(name: "herald.dl.write", batch: Self.maxWrite / Self.slotSize) { [unowned self] chunks in
                if self.writeError == nil {
                    do { try self.sink.write(chunks.map { ($0.data, $0.count, $0.offset) }) } catch {
                        self.lock.withLock { self.error = error }
                    }
                }
                for c in chunks { self.done(c.slot) }
            }
        }

        deinit { memory.deallocate() }

        /// The first write error, once there is one (nothing more is written after it).
        var writeError: Error? { lock.withLock { error } }

        /// A free buffer (its start; 1 MiB, page-aligned).
        func acquire() -> UnsafeMutableRawPointer {
            free.wait()
            let i = lock.withLock { freeSlots.removeLast() }
            return memory + i * Self.slotSize
        }

        /// Frees a buffer unused.
        func release(_ slot: UnsafeMutableRawPointer) {
            let i = (slot - UnsafeMutableRawPointer(memory)) / Self.slotSize
            lock.withLock { freeSlots.append(i) }
            free.signal()
        }

        /// Hands `count` bytes at `data` (within `slot`), which go at `offset` in the file, to
        /// the hasher and the writer.
        func submit(_ slot: UnsafeMutableRawPointer, data: UnsafeMutableRawPointer, count: Int, at offset: Int64) {
            let i = (slot - UnsafeMutableRawPointer(memory)) / Self.slotSize
            lock.withLock { users[i] = 2 }
            let chunk = Chunk(slot: i, data: UnsafeRawPointer(data), count: count, offset: offset)
            hashing.send(chunk)
            writing.send(chunk)
        }

        private func done(_ i: Int) {
            let last = lock.withLock { () -> Bool in
                users[i] -= 1
                guard users[i] == 0 else { return false }
                freeSlots.append(i)
                return true
            }
            if last { free.signal() }
        }

        /// Waits for both consumers to finish what they were given; the hasher, the bytes
        /// written and the first write error. Once; later calls return the same.
        func finish() -> Outcome {
            if let outcome { return outcome }
            hashing.finish()
            writing.finish()
            let o = Outcome(hasher: hasher, written: sink.written, writeError: writeError, direct: sink.direct)
            outcome = o
            return o
        }
    }

    /// A thread that takes items in order, up to `batch` at a time, until it is finished.
    final class Consumer<Item>: @unchecked Sendable {
        private let condition = NSCondition()
        private var queue = [Item]()
        private var closed = false
        private let exited = DispatchSemaphore(value: 0)

        init(name: String, batch: Int, _ work: @escaping @Sendable ([Item]) -> Void) {
            let thread = Thread { [self] in
                Thread.current.name = name // (named from within: Linux names only the running thread)
                while true {
                    condition.lock()
                    while queue.isEmpty && !closed { condition.wait() }
                    let items = Array(queue.prefix(max(1, batch)))
                    queue.removeFirst(items.count)
                    condition.unlock()
                    if items.isEmpty { break } // closed, and nothing left
                    work(items)
                }
                exited.signal()
            }
            thread.stackSize = 256 * 1024
            thread.start()
        }

        func send(_ item: Item) {
            condition.lock()
            queue.append(item)
            condition.signal()
            condition.unlock()
        }

        /// Waits until everything sent is done and the thread has ended.
        func finish() {
            condition.lock()
            closed = true
            condition.signal()
            condition.unlock()
            exited.wait()
        }
    }

    private static func find(_ buf: [UInt8], _ count: Int, _ pattern: [UInt8]) -> Int? {
        guard count >= pattern.count else { return nil }
        for i in 0...(count - pattern.count) where buf[i] == pattern[0] && buf[i + 1] == pattern[1] && buf[i + 2] == pattern[2] && buf[i + 3] == pattern[3] { return i }
        return nil
    }
}
