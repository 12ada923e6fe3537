/// Fixed-size chunks of a very long array, allocated only where something is stored: memory
/// follows the data seen, never the length claimed (a contact event of a thousand years costs
/// nothing until rows fall into it). Chunks live in one flat array, found through a map from
/// chunk number; the last chunk used is cached, since log rows arrive mostly in time order.
struct SparseChunks<Element> {
    static var chunkShift: Int { 6 }
    static var chunkSize: Int { 1 << chunkShift }
    /// Up to this many chunks, each chunk's place in `storage` is kept in a plain array (at most
    /// 256 bytes); beyond, in a map (a contact event of years must not cost its length).
    static var directChunks: Int { 64 }
    let count: Int
    let zero: Element
    private(set) var storage: [Element] = []
    private var index: [Int: Int] = [:]
    /// Base + 1 of each chunk in `storage` (0: not allocated), when `count` needs few chunks;
    /// allocated at the first update.
    private var direct: [Int32] = []
    private var lastChunk = -1
    private var lastBase = 0

    init(count: Int, zero: Element) {
        self.count = max(0, count)
        self.zero = zero
    }

    private var chunkCount: Int { (count + Self.chunkSize - 1) >> Self.chunkShift }
    private var isDirect: Bool { chunkCount <= Self.directChunks }

    /// Indices of the elements that chunks in use hold, in increasing order.
    var indices: [Int] {
        chunks.flatMap { c in (c.chunk * Self.chunkSize ..< min(count, (c.chunk + 1) * Self.chunkSize)) }
    }

    /// Chunk numbers in use, in increasing order, with their base in `storage`.
    var chunks: [(chunk: Int, base: Int)] {
        if isDirect { return direct.enumerated().compactMap { $0.element > 0 ? ($0.offset, Int($0.element) - 1) : nil } }
        return index.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
    }

    @inline(__always) private func base(of c: Int) -> Int? {
        if isDirect { return c < direct.count && direct[c] > 0 ? Int(direct[c]) - 1 : nil }
        return index[c]
    }

    @inline(__always) func get(_ i: Int) -> Element {
        guard i >= 0, i < count else { return zero }
        let c = i >> Self.chunkShift
        if c == lastChunk { return storage[lastBase + (i & (Self.chunkSize - 1))] }
        guard let base = base(of: c) else { return zero }
        return storage[base + (i & (Self.chunkSize - 1))]
    }

    /// Applies `body` to element `i` (allocating its chunk); ignores indices outside 0..<count.
    @inline(__always) mutating func update(_ i: Int, _ body: (inout Element) -> Void) {
        guard i >= 0, i < count else { return }
        let c = i >> Self.chunkShift
        if c != lastChunk { locate(c) }
        body(&storage[lastBase + (i & (Self.chunkSize - 1))])
    }

    @inline(never) private mutating func locate(_ c: Int) {
        if let base = base(of: c) { lastChunk = c; lastBase = base; return }
        let base = storage.count
        storage.append(contentsOf: repeatElement(zero, count: Self.chunkSize))
        if isDirect {
            if direct.isEmpty { direct = [Int32](repeating: 0, count: chunkCount) }
            direct[c] = Int32(base + 1)
        } else {
            index[c] = base
        }
        lastChunk = c
        lastBase = base
    }
}

/// A set of integers in 0..<count, stored sparsely (`SparseChunks` of 64-bit words).
struct Bitset {
    private var words: SparseChunks<UInt64>
    var count: Int { capacity }
    let capacity: Int
    init(count: Int) {
        capacity = max(0, count)
        words = SparseChunks(count: (capacity + 63) / 64, zero: 0)
    }
    @inline(__always) mutating func insert(_ i: Int) {
        guard i >= 0, i < capacity else { return }
        words.update(i >> 6) { $0 |= 1 << UInt64(i & 63) }
    }
    @inline(__always) func contains(_ i: Int) -> Bool {
        guard i >= 0, i < capacity else { return false }
        return words.get(i >> 6) & (1 << UInt64(i & 63)) != 0
    }
    var isEmpty: Bool { words.storage.allSatisfy { $0 == 0 } }
    var cardinality: Int { words.storage.reduce(0) { $0 + $1.nonzeroBitCount } }
    /// The smallest member, if any.
    var first: Int? {
        let size = SparseChunks<UInt64>.chunkSize
        for (chunk, base) in words.chunks {
            for k in 0..<size where words.storage[base + k] != 0 { return (chunk * size + k) * 64 + words.storage[base + k].trailingZeroBitCount }
        }
        return nil
    }
    /// How many distinct values `(member - origin) / width` the members in `from...to` take
    /// (members are visited in increasing order, so the values never decrease).
    func distinctBins(origin: Int, width: Int, from: Int = 0, to: Int = .max) -> Int {
        var count = 0, last = Int.min
        forEach { m in
            guard m >= from, m <= to else { return }
            let b = (m - origin) / width
            if b != last { count += 1; last = b }
        }
        return count
    }

    /// ORs the members in `from...to` into `bits`, member m at bit m - from.
    func or(from: Int, to: Int, into bits: inout [UInt64]) {
        guard to >= from else { return }
        let size = SparseChunks<UInt64>.chunkSize
        for (chunk, base) in words.chunks {
            for k in 0..<size {
                var word = words.storage[base + k]
                if word == 0 { continue }
                let first = (chunk * size + k) * 64 // member of bit 0
                if first + 63 < from || first > to { continue }
                if from > first { word &= ~0 << UInt64(from - first) }
                if to < first + 63 { word &= ~0 >> UInt64(first + 63 - to) }
                if word == 0 { continue }
                let offset = first - from // bit of `bits` that bit 0 goes to (may be negative)
                if offset < 0 {
                    bits[0] |= word >> UInt64(-offset)
                } else {
                    let w = offset >> 6, sh = offset & 63
                    bits[w] |= word << UInt64(sh)
                    if sh > 0, w + 1 < bits.count { bits[w + 1] |= word >> UInt64(64 - sh) }
                }
            }
        }
    }

    /// Members in increasing order.
    func forEach(_ body: (Int) -> Void) {
        let size = SparseChunks<UInt64>.chunkSize
        for (chunk, base) in words.chunks {
            for k in 0..<size {
                var word = words.storage[base + k]
                let w = chunk * size + k
                while word != 0 {
                    let b = word.trailingZeroBitCount
                    body(w * 64 + b)
                    word &= word - 1
                }
            }
        }
    }
}
