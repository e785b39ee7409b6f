"""A small ResNet for 28x28 grey images (Fashion-MNIST): a stem, two
stages of residual blocks with BatchNorm, global average pooling and a
linear classifier. Tally builds it with make_model() on each Python worker,
with the job's seed (examples/resnet/job.yaml)."""
import torch
from torch import nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, classes=10, width=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        self.stage1 = nn.Sequential(Block(width, width), Block(width, width))
        self.stage2 = nn.Sequential(Block(width, 2 * width, 2), Block(2 * width, 2 * width))
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = self.stage2(self.stage1(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def make_model():
    return ResNet()
