//! ggml's tensor types: the on-disk ids of a GGUF file's tensors (ggml.h `enum ggml_type`),
//! their names and block layouts. Read by the GGUF reader and the dequantizer alike.

use std::fmt;

/// ggml tensor types with their on-disk ids (ggml.h `enum ggml_type`).
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
}

impl GgmlType {
    pub(crate) const ALL: [GgmlType; 34] = {
        use GgmlType::*;
        [
            F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ2_XXS,
            IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS, I8, I16, I32, I64, F64, IQ1_M, BF16, TQ1_0,
            TQ2_0, MXFP4, NVFP4, Q1_0,
        ]
    };

    /// (id, name, elements per block, bytes per block), as in ggml's type traits.
    const fn traits(self) -> (u32, &'static str, usize, usize) {
        use GgmlType::*;
        const QK_K: usize = 256;
        match self {
            F32 => (0, "F32", 1, 4),
            F16 => (1, "F16", 1, 2),
            Q4_0 => (2, "Q4_0", 32, 2 + 16),
            Q4_1 => (3, "Q4_1", 32, 2 + 2 + 16),
            Q5_0 => (6, "Q5_0", 32, 2 + 4 + 16),
            Q5_1 => (7, "Q5_1", 32, 2 + 2 + 4 + 16),
            Q8_0 => (8, "Q8_0", 32, 2 + 32),
            Q8_1 => (9, "Q8_1", 32, 4 + 4 + 32),
            Q2_K => (10, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
            Q3_K => (11, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
            Q4_K => (12, "Q4_K", QK_K, 2 + 2 + 12 + QK_K / 2),
            Q5_K => (13, "Q5_K", QK_K, 2 + 2 + 12 + QK_K / 8 + QK_K / 2),
            Q6_K => (14, "Q6_K", QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2),
            Q8_K => (15, "Q8_K", QK_K, 4 + QK_K + QK_K / 8),
            IQ2_XXS => (16, "IQ2_XXS", QK_K, 2 + QK_K / 4),
            IQ2_XS => (17, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32),
            IQ3_XXS => (18, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8),
            IQ1_S => (19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16),
            IQ4_NL => (20, "IQ4_NL", 32, 2 + 16),
            IQ3_S => (21, "IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4),
            IQ2_S => (22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16),
            IQ4_XS => (23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
            I8 => (24, "I8", 1, 1),
            I16 => (25, "I16", 1, 2),
            I32 => (26, "I32", 1, 4),
            I64 => (27, "I64", 1, 8),
            F64 => (28, "F64", 1, 8),
            IQ1_M => (29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
            BF16 => (30, "BF16", 1, 2),
            TQ1_0 => (34, "TQ1_0", QK_K, 2 + 4 * 13),
            TQ2_0 => (35, "TQ2_0", QK_K, 2 + 64),
            MXFP4 => (39, "MXFP4", 32, 1 + 16),
            NVFP4 => (40, "NVFP4", 64, 4 + 32),
            Q1_0 => (41, "Q1_0", 128, 2 + 16),
        }
    }

    /// The type with ggml id `id`, if it is one ggml defines (31-33 and 36-38 were removed).
    pub(crate) fn from_id(id: u32) -> Option<GgmlType> {
        Self::ALL.into_iter().find(|t| t.id() == id)
    }

    pub(crate) const fn id(self) -> u32 {
        self.traits().0
    }

    pub(crate) const fn name(self) -> &'static str {
        self.traits().1
    }

    /// Elements per block.
    pub(crate) const fn block_size(self) -> usize {
        self.traits().2
    }

    /// Bytes per block.
    pub(crate) const fn type_size(self) -> usize {
        self.traits().3
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
