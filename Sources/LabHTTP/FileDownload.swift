import Foundation
import HeraldCore
import LabNet
import CLinuxEvents
#if canImport(Glibc)
import Glibc
#endif

/// Streams an HTTP GET body straight into a file while hashing it: no body is held in memory,
/// and the checksum is ready when the last byte lands. Used to gather logs (hundreds of MB/s on
/// loopback, where URLSession on Linux manages about a tenth of that).
public enum FileDownload {
    public struct Result: Sendable {
        public var status: Int
        /// Bytes written by this request.
        public var bytes: Int64
    }

    /// GETs `url` (http only) with `headers`; on 200 the file is truncated first, on 206 the body is
    /// appended. Every written byte is fed to `hasher` in order.
    public static func get(_ url: URL, headers: [String: String], appendingTo file: URL, hasher: inout SHA256, timeout: TimeInterval = 60) throws -> Result {
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

        // Read the head.
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
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
            if k == "content-length" { length = Int64(v) }
            if k == "transfer-encoding", v.lowercased().contains("chunked") { throw LabClient.Failure(status: status, message: "chunked downloads are not supported") }
        }
        guard status == 200 || status == 206 else {
            throw LabClient.Failure(status: status, message: String(decoding: buffer[bodyStart..<filled], as: UTF8.self))
        }
        let handle = try FileHandle(forWritingTo: file)
        defer { try? handle.close() }
        if status == 200 { try handle.truncate(atOffset: 0) } else { try handle.seekToEnd() }
        var written: Int64 = 0
        // Hashing runs on its own thread, a few chunks behind the socket: each chunk is received
        // into one of a ring of buffers, written to the file from there, and hashed from there
        // (no copy); a buffer is received into again only once the hasher is done with it.
        let pipeline = HashPipeline(hasher)
        defer { hasher = pipeline.finish() }
        // Write-back starts as the file grows (sync_file_range, without waiting), so that the
        // fsync the gatherer makes at the end finds little left to write.
        let start = status == 200 ? 0 : Int64(lseek(handle.fileDescriptor, 0, SEEK_CUR))
        var flushed: Int64 = 0
        func writeAll(_ p: UnsafeRawPointer, _ count: Int) throws {
            var off = 0
            while off < count {
                let w = write(handle.fileDescriptor, p + off, count - off)
                if w < 0 { if errno == EINTR { continue }; throw LabClient.Failure(status: nil, message: "write failed (errno \(errno))") }
                off += w
            }
            written += Int64(count)
            if written - flushed >= 8 << 20 {
                _ = heraldlab_start_writeback(handle.fileDescriptor, start + flushed, written - flushed)
                flushed = written
            }
        }
        if filled > bodyStart {
            let slot = pipeline.acquire()
            let n = filled - bodyStart
            buffer.withUnsafeBytes { slot.copyMemory(from: $0.baseAddress! + bodyStart, byteCount: n) }
            try writeAll(slot, n)
            pipeline.hash(slot, n)
        }
        while length.map({ written < $0 }) ?? true {
            let slot = pipeline.acquire()
            let n: Int
            do { n = try fd.read(into: UnsafeMutableRawBufferPointer(start: slot, count: HashPipeline.bufferSize)) } catch {
                pipeline.release(slot)
                throw failure(error)
            }
            if n == 0 { pipeline.release(slot); break }
            do { try writeAll(slot, n) } catch { pipeline.release(slot); throw error }
            pipeline.hash(slot, n)
        }
        if let length, written != length { throw LabClient.Failure(status: status, message: "connection closed after \(written) of \(length) bytes") }
        return Result(status: status, bytes: written)
    }

    /// Hashes chunks on a serial queue, in order, from a ring of `slots` buffers: `acquire` waits
    /// until a buffer is free, `hash` hands a filled one to the hasher, which frees it when done.
    final class HashPipeline: @unchecked Sendable {
        static let bufferSize = 1 << 20
        static let slots = 8
        private var hasher: SHA256
        private let queue = DispatchQueue(label: "heraldlab.download.hash")
        private let free = DispatchSemaphore(value: HashPipeline.slots)
        private let lock = NSLock()
        private var buffers: [UnsafeMutableRawPointer]
        private let all: [UnsafeMutableRawPointer]
        init(_ hasher: SHA256) {
            self.hasher = hasher
            all = (0..<Self.slots).map { _ in UnsafeMutableRawPointer.allocate(byteCount: Self.bufferSize, alignment: 64) }
            buffers = all
        }
        deinit { for b in all { b.deallocate() } }
        func acquire() -> UnsafeMutableRawPointer {
            free.wait()
            return lock.withLock { buffers.removeLast() }
        }
        func release(_ buffer: UnsafeMutableRawPointer) {
            lock.withLock { buffers.append(buffer) }
            free.signal()
        }
        func hash(_ buffer: UnsafeMutableRawPointer, _ count: Int) {
            let address = UInt(bitPattern: buffer) // the ring owns the memory; only the address travels
            queue.async {
                let p = UnsafeMutableRawPointer(bitPattern: address)!
                self.hasher.update(UnsafeRawBufferPointer(start: p, count: count))
                self.release(p)
            }
        }
        /// Waits for the hasher to catch up; returns it.
        func finish() -> SHA256 { queue.sync { hasher } }
    }

    private static func find(_ buf: [UInt8], _ count: Int, _ pattern: [UInt8]) -> Int? {
        guard count >= pattern.count else { return nil }
        for i in 0...(count - pattern.count) where buf[i] == pattern[0] && buf[i + 1] == pattern[1] && buf[i + 2] == pattern[2] && buf[i + 3] == pattern[3] { return i }
        return nil
    }
}
