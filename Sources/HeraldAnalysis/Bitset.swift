/// A fixed-size set of small integers.
struct Bitset {
    private(set) var words: [UInt64]
    let count: Int
    init(count: Int) {
        self.count = max(0, count)
        words = [UInt64](repeating: 0, count: (self.count + 63) / 64)
    }
    @inline(__always) mutating func insert(_ i: Int) {
        guard i >= 0, i < count else { return }
        words[i >> 6] |= 1 << UInt64(i & 63)
    }
    @inline(__always) func contains(_ i: Int) -> Bool {
        guard i >= 0, i < count else { return false }
        return words[i >> 6] & (1 << UInt64(i & 63)) != 0
    }
    var isEmpty: Bool { words.allSatisfy { $0 == 0 } }
    var cardinality: Int { words.reduce(0) { $0 + $1.nonzeroBitCount } }
    /// The smallest member, if any.
    var first: Int? {
        for (w, word) in words.enumerated() where word != 0 { return w * 64 + word.trailingZeroBitCount }
        return nil
    }
    /// Members in increasing order.
    func forEach(_ body: (Int) -> Void) {
        for (w, var word) in words.enumerated() {
            while word != 0 {
                let b = word.trailingZeroBitCount
                body(w * 64 + b)
                word &= word - 1
            }
        }
    }
}
