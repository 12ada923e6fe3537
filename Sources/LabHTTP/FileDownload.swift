import AsyncHTTPClient
import CLinuxEvents
import Foundation
import HeraldCore
import LabNet
import NIOCore
import NIOHTTP1
import NIOSSL
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Streams an HTTP GET body straight into a file while hashing it: no body is held in memory,
/// and the checksum is ready when the last byte lands. Used to gather logs (about a gigabyte a
/// second on loopback, where URLSession on Linux manages a tenth of that).
///
/// The transport is the process's AsyncHTTPClient (`LabHTTPClient.shared`: http, or https
/// against the lab CA), with a response delegate on the request's event loop; no thread waits
/// on the socket, and the caller awaits. Each part of the body the client reads is copied into a
/// ring of 1 MiB buffers, each filled completely before it is handed on, so that every chunk but
/// the first and the last covers whole pages of the file. Two consumers take each chunk at once,
/// each on its own thread: the hasher (in order) and the writer (at the chunk's offset); a
/// buffer is received into again once both are done with it. When no buffer is free the
/// delegate answers the part with a future that completes when one is, and the client reads
/// nothing more from the socket until then (back-pressure, without blocking the event loop).
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

    /// GETs `url` (http, or https checked against the lab CA) with `headers`; on 200 the file is
    /// truncated first, on 206 the body is appended. Every written byte is fed to `hasher` in
    /// order. A chunked body is taken as it comes (its length is known at its end only). Throws
    /// `LabClient.Failure` with the status and the body's first bytes on any other status; and
    /// when the body ends before its Content-Length (or a chunked body before its last chunk),
    /// nothing arrives for `timeout` seconds while the download waits on the server (connecting,
    /// the head, the body; not while it waits on its own disk), or a write fails. The file then
    /// holds the body's start, in order (a download can resume from its size).
    public static func get(_ url: URL, headers: [String: String], appendingTo file: URL, hasher: inout SHA256, timeout: TimeInterval = 60) async throws -> Result {
        try await get(url, headers: headers, appendingTo: file, hasher: &hasher, timeout: timeout, mode: .direct)
    }

    /// `beforeWrite` (tests) is called on the writer's thread before each batch of chunks it writes.
    static func get(_ url: URL, headers: [String: String], appendingTo file: URL, hasher: inout SHA256, timeout: TimeInterval = 60,
                    mode: WriteMode, beforeWrite: (@Sendable () -> Void)? = nil) async throws -> Result {
        func failure(_ message: String) -> LabClient.Failure {
            LabClient.Failure(status: nil, message: "download of \(url.absoluteString): \(message)")
        }
        guard timeout.isFinite, timeout > 0, timeout <= 86_400 else { throw failure("timeout \(timeout) s is not 0 to 86400 s") }
        var request: HTTPClient.Request
        do {
            request = try HTTPClient.Request(url: url.absoluteString, method: .GET)
            request.tlsConfiguration = try LabHTTPClient.tls(for: url)
        } catch let e as NetError {
            throw failure(e.message)
        } catch {
            throw failure(LabHTTPClient.describe(error, url: url, timeout: timeout))
        }
        for (name, value) in headers.sorted(by: { $0.key < $1.key }) where !["host", "connection", "content-length"].contains(name.lowercased()) {
            request.headers.add(name: name, value: value)
        }

        let client = LabHTTPClient.shared
        // The delegate and the connection on one event loop: no hop per part of the body.
        let loop = client.eventLoopGroup.next()
        let receiver = Receiver(file: file, mode: mode, hasher: hasher, loop: loop, idle: timeout, beforeWrite: beforeWrite)
        let task = client.execute(request: request, delegate: receiver, eventLoop: .delegateAndChannel(on: loop))
        receiver.watch(task)
        var requestError: Error?
        do {
            try await withTaskCancellationHandler {
                try await task.futureResult.get()
            } onCancel: {
                task.cancel()
            }
        } catch {
            requestError = error
        }
        // The receiver hands its last chunk on (it has, unless the client failed the request
        // without telling it), then the consumers finish with the ring before it goes.
        let failedWith = requestError
        do { try await loop.submit { receiver.close(failedWith) }.get() } catch {
            // The loop is shut down (the process is stopping): nothing runs on it any more, so
            // the receiver is closed here, and what it received still reaches the file.
            receiver.close(failedWith ?? error)
        }
        let outcome = await receiver.pipeline?.finish()
        if let outcome { hasher = outcome.hasher }

        let status = receiver.status
        if let e = receiver.openError ?? outcome?.writeError { throw failure("\(e)") }
        if let e = receiver.badHead { throw e }
        guard status != 0 else {
            // No head: the connect, the request or the wait for the answer failed.
            if requestError is Receiver.Stalled { throw failure(LabHTTPClient.noAnswer(within: timeout)) }
            throw failure(LabHTTPClient.describe(requestError ?? HTTPClientError.remoteConnectionClosed, url: url, timeout: timeout))
        }
        guard status == 200 || status == 206 else {
            throw LabClient.Failure(status: status, message: String(decoding: receiver.refusal, as: UTF8.self))
        }
        let written = outcome?.written ?? 0
        let length = receiver.length
        if let requestError {
            if requestError is Receiver.Stalled {
                throw failure("nothing received for \(Saturating.int64(timeout.rounded(.up))) s, after \(written) of \(length.map { "\($0)" } ?? "?") bytes")
            }
            guard closedEarly(requestError) else { throw failure(LabHTTPClient.describe(requestError, url: url, timeout: timeout)) }
            if let length { throw LabClient.Failure(status: status, message: "connection closed after \(written) of \(length) bytes") }
            throw LabClient.Failure(status: status, message: "connection closed after \(written) bytes, before the body's end")
        }
        if let length, written != length {
            throw LabClient.Failure(status: status, message: "connection closed after \(written) of \(length) bytes")
        }
        guard written == receiver.received else {
            throw LabClient.Failure(status: status, message: "\(written) of the \(receiver.received) bytes received were written")
        }
        return Result(status: status, bytes: written, direct: outcome?.direct ?? false)
    }

    /// Whether `error` is the connection ending in the middle of the body.
    static func closedEarly(_ error: Error) -> Bool {
        if let e = error as? HTTPClientError, e == .remoteConnectionClosed { return true }
        if let e = error as? HTTPParserError, e == .invalidEOFState { return true }
        if let e = error as? NIOSSLError, e == .uncleanShutdown { return true }
        if let e = error as? IOError, [ECONNRESET, EPIPE].contains(e.errnoCode) { return true }
        return false
    }

    /// AsyncHTTPClient's delegate for one download, called on `loop` (the connection's): opens
    /// the file and starts the ring at a 200 or 206 head, copies each part of the body into the
    /// ring's current buffer, and hands each full buffer on. Everything but `init`, `watch` and
    /// the properties `get` reads once the request is over runs on `loop`.
    ///
    /// Invariant (why unchecked): AsyncHTTPClient requires a Sendable delegate, and this one's
    /// state is confined to `loop`: AsyncHTTPClient calls every delegate method there
    /// (`.delegateAndChannel(on: loop)`), `watch` and `close` hop onto it, and the ring calls
    /// back through `loop.execute`. `get` reads the results (status, length, refusal, badHead,
    /// openError, pipeline, received) only after `close` has run on the loop (awaited through
    /// `loop.submit`), so those reads happen after the last write. The one exception, `close`
    /// called off the loop, is when the loop has shut down and nothing runs on it any more.
    final class Receiver: HTTPClientResponseDelegate, @unchecked Sendable {
        typealias Response = Void

        /// The most of a refusal's body kept for its message.
        static let refusalBytes = 64 << 10

        /// No byte for `idle`, while waiting on the server.
        struct Stalled: Error {}
        /// A refusal's body is long enough.
        struct Enough: Error {}

        let file: URL
        let mode: WriteMode
        let hasher: SHA256
        let loop: EventLoop
        let idle: TimeAmount
        let beforeWrite: (@Sendable () -> Void)?

        private(set) var status = 0
        /// The body's Content-Length; nil for a chunked body, or one that ends with the connection.
        private(set) var length: Int64?
        /// The first bytes of a refusal's body (not 200 or 206).
        private(set) var refusal = [UInt8]()
        /// A head that cannot be taken (a bad Content-Length).
        private(set) var badHead: LabClient.Failure?
        /// The file could not be opened.
        private(set) var openError: Error?
        /// Started at a 200 or 206 head.
        private(set) var pipeline: Pipeline?
        /// Body bytes copied into the ring.
        private(set) var received: Int64 = 0

        /// Where the next byte goes in the file.
        private var offset: Int64 = 0
        /// The buffer being filled: its start, where its chunk starts, how much it takes and holds.
        private var slot: UnsafeMutableRawPointer?
        private var data: UnsafeMutableRawPointer?
        private var capacity = 0
        private var filled = 0
        /// What is left of a part that found no free buffer, and the answer AsyncHTTPClient waits on.
        private var pending: ByteBuffer?
        private var resume: EventLoopPromise<Void>?
        private var lastProgress = NIODeadline.now()
        private var watchdog: Scheduled<Void>?
        private var task: HTTPClient.Task<Void>?
        private var closed = false

        init(file: URL, mode: WriteMode, hasher: SHA256, loop: EventLoop, idle: TimeInterval, beforeWrite: (@Sendable () -> Void)? = nil) {
            self.file = file
            self.beforeWrite = beforeWrite
            self.mode = mode
            self.hasher = hasher
            self.loop = loop
            self.idle = .nanoseconds(Saturating.nanoseconds(idle))
        }

        private var accepted: Bool { status == 200 || status == 206 }

        /// Fails `task` once nothing has arrived for `idle` while waiting on the server (time
        /// spent waiting for a free buffer, that is for the disk or the hasher, does not count).
        func watch(_ task: HTTPClient.Task<Void>) {
            loop.execute { [self] in
                guard !closed else { return }
                self.task = task
                lastProgress = .now()
                check(at: lastProgress + idle)
            }
        }

        private func check(at deadline: NIODeadline) {
            watchdog = loop.scheduleTask(deadline: deadline) { [self] in
                guard !closed else { return }
                let now = NIODeadline.now()
                if resume != nil {
                    check(at: now + idle)
                } else if now - lastProgress >= idle {
                    task?.fail(reason: Stalled())
                } else {
                    check(at: lastProgress + idle)
                }
            }
        }

        func didReceiveHead(task: HTTPClient.Task<Void>, _ head: HTTPResponseHead) -> EventLoopFuture<Void> {
            lastProgress = .now()
            status = Int(head.status.code)
            guard accepted else { return loop.makeSucceededVoidFuture() }
            if let v = head.headers.first(name: "content-length") {
                guard let n = Int64(v.trimmingCharacters(in: .whitespaces)), n >= 0 else {
                    badHead = LabClient.Failure(status: status, message: "bad Content-Length \"\(v.prefix(40))\"")
                    return loop.makeFailedFuture(badHead!)
                }
                length = n
            }
            // open(2) and lseek(2) here, on the loop (brief); truncating is the writer's first job.
            let sink: FileSink
            do { sink = try FileSink(file, mode: mode) } catch {
                openError = error
                return loop.makeFailedFuture(error)
            }
            let truncate = status == 200
            offset = truncate ? 0 : sink.size
            let pipeline = Pipeline(hasher, sink, beforeWrite: beforeWrite)
            if truncate { pipeline.truncateFirst() }
            self.pipeline = pipeline
            return loop.makeSucceededVoidFuture()
        }

        func didReceiveBodyPart(task: HTTPClient.Task<Void>, _ buffer: ByteBuffer) -> EventLoopFuture<Void> {
            lastProgress = .now()
            guard !closed else { return loop.makeSucceededVoidFuture() }
            guard let pipeline else {
                // A refusal: its first bytes are its message.
                refusal += buffer.readableBytesView.prefix(Self.refusalBytes - refusal.count)
                return refusal.count < Self.refusalBytes ? loop.makeSucceededVoidFuture() : loop.makeFailedFuture(Enough())
            }
            if let e = pipeline.writeError { return loop.makeFailedFuture(e) } // stop early: nothing more is written
            var rest = buffer
            if pour(&rest, into: pipeline) { return loop.makeSucceededVoidFuture() }
            let promise = loop.makePromise(of: Void.self)
            pending = rest
            resume = promise
            return promise.futureResult
        }

        /// Copies `buffer` into the ring, handing on each buffer it fills. False when a buffer
        /// was needed and none was free: the rest is left in `buffer`, and `freed` is called
        /// on the loop once one is.
        private func pour(_ buffer: inout ByteBuffer, into pipeline: Pipeline) -> Bool {
            while buffer.readableBytes > 0 {
                if slot == nil {
                    guard let s = pipeline.acquire(orWhenFree: { [self] in loop.execute { self.freed() } }) else { return false }
                    // The first chunk starts as far into its buffer as its offset is into a
                    // page: the page boundaries of the file then fall on page boundaries of the
                    // buffers.
                    let lead = Int(offset % Int64(Pipeline.page))
                    slot = s
                    data = s + lead
                    capacity = Pipeline.slotSize - lead
                    filled = 0
                }
                let k = min(buffer.readableBytes, capacity - filled)
                let to = data! + filled
                buffer.withUnsafeReadableBytes { to.copyMemory(from: $0.baseAddress!, byteCount: k) }
                buffer.moveReaderIndex(forwardBy: k)
                filled += k
                received += Int64(k)
                if filled == capacity { handOn(pipeline) }
            }
            return true
        }

        /// The current buffer to the consumers (or back to the ring, empty).
        private func handOn(_ pipeline: Pipeline) {
            guard let slot else { return }
            if filled > 0 {
                pipeline.submit(slot, data: data!, count: filled, at: offset)
                offset += Int64(filled)
            } else {
                pipeline.release(slot)
            }
            self.slot = nil
            filled = 0
        }

        /// A buffer is free: the waiting part goes on.
        private func freed() {
            guard !closed, let pipeline, var rest = pending, let promise = resume else { return }
            lastProgress = .now()
            if let e = pipeline.writeError {
                (pending, resume) = (nil, nil)
                promise.fail(e)
            } else if pour(&rest, into: pipeline) {
                (pending, resume) = (nil, nil)
                promise.succeed()
            } else {
                pending = rest
            }
        }

        func didFinishRequest(task: HTTPClient.Task<Void>) throws {
            close(nil)
        }

        func didReceiveError(task: HTTPClient.Task<Void>, _ error: Error) {
            close(error)
        }

        /// The request is over: what was received goes to the consumers even when the stream
        /// broke (a retry resumes after it); part of a body still waiting for a buffer is
        /// dropped, and the file holds the body's start. Once; on the loop.
        func close(_ error: Error?) {
            guard !closed else { return }
            closed = true
            watchdog?.cancel()
            (watchdog, task) = (nil, nil)
            guard let pipeline else { return }
            pipeline.cancelWait()
            if let promise = resume {
                (pending, resume) = (nil, nil)
                promise.fail(error ?? HTTPClientError.cancelled)
            }
            handOn(pipeline)
        }
    }

    /// The file a body goes to: a descriptor through the page cache, and one with O_DIRECT for
    /// whole pages while the file system takes it. Opened where the head arrives; used by the
    /// writer's thread only from then on (not Sendable: the `Pipeline` owns it and only its
    /// writer's thread uses it until both consumers have ended).
    final class FileSink {
        static let page = 4096
        let path: String
        /// The file's size when opened: where a 206's body starts.
        let size: Int64
        private let fd: Int32
        private var directFD: Int32?
        private var refuseNextDirectWrite: Bool
        /// Bytes written, all of them in order from where the body starts.
        private(set) var written: Int64 = 0
        /// Write-back of what went through the page cache is started as it grows (without
        /// waiting), so that the final fsync finds little left to write.
        private var writebackFrom: Int64
        private var unflushed = 0

        init(_ url: URL, mode: WriteMode) throws {
            path = url.path
            fd = open(path, O_WRONLY | O_CLOEXEC)
            guard fd >= 0 else { throw Self.error("cannot open \(url.path) for writing", errno) }
            let end = Int64(lseek(fd, 0, SEEK_END))
            guard end >= 0 else { let e = errno; close(fd); throw Self.error("cannot seek in \(url.path)", e) }
            size = end
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

        /// Empties the file (a 200's body starts at 0), before anything is written.
        func truncate() throws {
            guard ftruncate(fd, 0) == 0 else { throw Self.error("cannot truncate \(path)", errno) }
            writebackFrom = 0
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
    /// thread of its own): `acquire` takes a free buffer or, when there is none, keeps a call
    /// for when one frees; `submit` hands a filled one to both, and the second of them to be
    /// done frees it.
    ///
    /// Invariant (why unchecked): the ring is raw memory (`memory`) shared with the two consumer
    /// threads, and `hasher` and `sink` are each one thread's. The slots' bookkeeping is a Mutex
    /// (`bookkeeping`). A slot belongs to the receiver (on its event loop) from `acquire` until
    /// `submit`, then to the consumers until the second `done` frees it, so no byte is written
    /// while a consumer reads it. `hasher` is used by the hashing thread only, and `sink` by the
    /// writing thread only, until both threads have ended (`finish` reads them after the second
    /// `ended`); `hashing` and `writing` are set once in `init` and are Sendable.
    final class Pipeline: @unchecked Sendable {
        static let slotSize = 1 << 20
        static let slots = 16
        static let page = FileSink.page
        /// Direct writes of several chunks in one call, up to this many bytes.
        static let maxWrite = 4 << 20

        struct Outcome: Sendable {
            var hasher: SHA256
            var written: Int64
            var writeError: Error?
            var direct: Bool
        }

        /// `count` bytes at `start` (bytes from the ring's start, within `slot`), which go at
        /// `offset` in the file.
        private struct Chunk: Sendable {
            var slot: Int
            var start: Int
            var count: Int
            var offset: Int64
        }

        /// The writer's work: the file emptied first (200), then chunks.
        private enum Job: Sendable {
            case truncate
            case write(Chunk)
        }

        private let memory: UnsafeMutableRawPointer
        /// The slots' bookkeeping, under one lock.
        private struct Slots {
            var freeSlots: [Int]
            /// Consumers still using each slot (0, 1 or 2).
            var users: [Int]
            /// Called (once) when a slot frees after `acquire` found none.
            var waiter: (@Sendable () -> Void)?
            /// Consumers whose thread has not ended.
            var running = 2
            /// The first write error.
            var error: Error?
        }
        private let bookkeeping: Mutex<Slots>
        private var hasher: SHA256
        private let sink: FileSink
        private var hashing: Consumer<Chunk>!
        private var writing: Consumer<Job>!

        init(_ hasher: SHA256, _ sink: FileSink, beforeWrite: (@Sendable () -> Void)? = nil) {
            self.hasher = hasher
            self.sink = sink
            // Huge pages where the system gives them (THP): a few faults instead of thousands,
            // and cheaper pinning of the buffers for direct writes.
            memory = UnsafeMutableRawPointer.allocate(byteCount: Self.slots * Self.slotSize, alignment: 2 << 20)
            _ = madvise(memory, Self.slots * Self.slotSize, MADV_HUGEPAGE)
            bookkeeping = Mutex(Slots(freeSlots: Array((0..<Self.slots).reversed()), users: Array(repeating: 0, count: Self.slots)))
            hashing = Consumer(name: "herald.dl.hash", batch: Self.slots) { [unowned self] chunks in
                for c in chunks {
                    self.hasher.update(UnsafeRawBufferPointer(start: self.memory + c.start, count: c.count))
                    self.done(c.slot)
                }
            }
            writing = Consumer(name: "herald.dl.write", batch: Self.maxWrite / Self.slotSize) { [unowned self] jobs in
                beforeWrite?()
                var chunks = [Chunk]()
                for job in jobs {
                    switch job {
                    case .truncate:
                        do { try self.sink.truncate() } catch { self.bookkeeping.withLock { $0.error = $0.error ?? error } }
                    case .write(let c): chunks.append(c)
                    }
                }
                if self.writeError == nil, !chunks.isEmpty {
                    do { try self.sink.write(chunks.map { (UnsafeRawPointer(self.memory + $0.start), $0.count, $0.offset) }) } catch {
                        self.bookkeeping.withLock { $0.error = error }
                    }
                }
                for c in chunks { self.done(c.slot) }
            }
        }

        deinit { memory.deallocate() }

        /// The first write error, once there is one (nothing more is written after it).
        var writeError: Error? { bookkeeping.withLock { $0.error } }

        /// The file is emptied before any chunk is written (a 200). Before the first `submit`.
        func truncateFirst() {
            writing.send(.truncate)
        }

        /// A free buffer (its start; 1 MiB, page-aligned); or nil, and `wake` is called (from
        /// a consumer's thread) when one frees, unless `cancelWait` comes first.
        func acquire(orWhenFree wake: @escaping @Sendable () -> Void) -> UnsafeMutableRawPointer? {
            let i = bookkeeping.withLock { s -> Int? in
                if let i = s.freeSlots.popLast() { return i }
                s.waiter = wake
                return nil
            }
            return i.map { memory + $0 * Self.slotSize }
        }

        /// Forgets the call `acquire` keeps.
        func cancelWait() {
            bookkeeping.withLock { $0.waiter = nil }
        }

        /// Frees a buffer unused.
        func release(_ slot: UnsafeMutableRawPointer) {
            let i = (slot - UnsafeMutableRawPointer(memory)) / Self.slotSize
            var wake: (@Sendable () -> Void)?
            bookkeeping.withLock { s in
                s.freeSlots.append(i)
                (wake, s.waiter) = (s.waiter, nil)
            }
            wake?()
        }

        /// Hands `count` bytes at `data` (within `slot`), which go at `offset` in the file, to
        /// the hasher and the writer.
        func submit(_ slot: UnsafeMutableRawPointer, data: UnsafeMutableRawPointer, count: Int, at offset: Int64) {
            let i = (slot - UnsafeMutableRawPointer(memory)) / Self.slotSize
            bookkeeping.withLock { $0.users[i] = 2 }
            let chunk = Chunk(slot: i, start: data - UnsafeMutableRawPointer(memory), count: count, offset: offset)
            hashing.send(chunk)
            writing.send(.write(chunk))
        }

        private func done(_ i: Int) {
            var wake: (@Sendable () -> Void)?
            bookkeeping.withLock { s in
                s.users[i] -= 1
                guard s.users[i] == 0 else { return }
                s.freeSlots.append(i)
                (wake, s.waiter) = (s.waiter, nil)
            }
            wake?()
        }

        /// Once both consumers have finished what they were given (their threads end): the
        /// hasher, the bytes written and the first write error. Once, after the last `submit`;
        /// waits without blocking a thread.
        func finish() async -> Outcome {
            await withCheckedContinuation { (done: CheckedContinuation<Outcome, Never>) in
                let ended: @Sendable () -> Void = { [self] in
                    guard bookkeeping.withLock({ s in s.running -= 1; return s.running }) == 0 else { return }
                    done.resume(returning: Outcome(hasher: hasher, written: sink.written, writeError: writeError, direct: sink.direct))
                }
                hashing.finish(then: ended)
                writing.finish(then: ended)
            }
        }
    }

    /// A thread that takes items in order, up to `batch` at a time, until it is finished.
    final class Consumer<Item: Sendable>: Sendable {
        /// What was sent and not yet taken, whether `finish` came, and what to call then.
        private struct State {
            var queue = [Item]()
            var closed = false
            var ended: (@Sendable () -> Void)?
        }
        private let state = Mutex(State())
        /// Signalled once per `send` and once by `finish`; the thread waits on it when it finds
        /// the queue empty (a signal whose item a larger batch already took only wakes it once more).
        private let wakeup = DispatchSemaphore(value: 0)

        init(name: String, batch: Int, _ work: @escaping @Sendable ([Item]) -> Void) {
            let thread = Thread { [self] in
                Thread.current.name = name // (named from within: Linux names only the running thread)
                while true {
                    // nil: nothing yet; []: closed, and nothing left.
                    let items: [Item]? = state.withLock { s in
                        if s.queue.isEmpty { return s.closed ? [] : nil }
                        let items = Array(s.queue.prefix(max(1, batch)))
                        s.queue.removeFirst(items.count)
                        return items
                    }
                    guard let items else { wakeup.wait(); continue }
                    if items.isEmpty { break }
                    work(items)
                }
                let then = state.withLock { $0.ended }
                then?()
            }
            thread.stackSize = 256 * 1024
            thread.start()
        }

        func send(_ item: Item) {
            state.withLock { $0.queue.append(item) }
            wakeup.signal()
        }

        /// The thread does what was sent, then calls `then` and ends.
        func finish(then: @escaping @Sendable () -> Void) {
            state.withLock { s in
                s.closed = true
                s.ended = then
            }
            wakeup.signal()
        }
    }
}
